// location_get: the browser answers where the user is, within 5 seconds, as a result and never
// as an error. The browser's permission state is the only memory (no cache here): a second call
// after PENDING reads it again, so a grant given in the meantime answers GRANTED without a card.

import { clientToolDeclaration } from './wire.js';

/** How long one location_get call waits before answering PENDING (the server waits 30 s). */
export const LOCATION_RACE_MS = 5000;

const GEOLOCATION_OPTIONS = Object.freeze({ timeout: LOCATION_RACE_MS, maximumAge: 0 });

const DO_NOT_RETRY_DECLINED = 'Do not retry; ask for a place name instead if you need one.';

const MESSAGES = Object.freeze({
  blocked: `The user has blocked location access for this site. ${DO_NOT_RETRY_DECLINED}`,
  notNow: `The user chose not to share their location. ${DO_NOT_RETRY_DECLINED}`,
  refused: `The user refused the browser's location request. ${DO_NOT_RETRY_DECLINED}`,
  pending:
    'The user has been asked for their location and has not answered yet. You may call ' +
    'location_get again after a short wait, or continue without the location.',
  insecure: 'Location is unavailable because the page is not served securely. Do not retry.',
  unsupported: 'This browser cannot share a location. Do not retry.',
  positionUnavailable: 'The browser could not determine a position. Do not retry.',
  positionTimeout: 'The browser took too long to determine a position. Do not retry.',
  failed: 'Reading the location failed in the browser. Do not retry.',
});

const MESSAGE_RESULT_SCHEMA = (status) => ({
  type: 'object',
  properties: {
    status: { const: status },
    message: { type: 'string' },
  },
  required: ['status', 'message'],
  additionalProperties: false,
});

/**
 * The declaration sent in the `client-tool-register` frame: blocking, answered by the page
 * itself (`serve`), no arguments. The description is what the model reads.
 */
export const LOCATION_TOOL = clientToolDeclaration({
  kind: 'blocking',
  name: 'location_get',
  title: 'Share your location',
  summary: 'Your position, as your browser knows it',
  description:
    "Returns the user's current location from their browser, as {status, ...}, never an error. " +
    'GRANTED: latitude, longitude (WGS84 degrees), accuracy and timestamp (ms since epoch). ' +
    'accuracy is a radius in metres around the point, not a point: do not report more ' +
    'precision than it allows. DECLINED: the user declined. Do not retry; ask for a place ' +
    'name instead if you need one. UNAVAILABLE: no location can be had here. Do not retry. ' +
    'PENDING: the user has not answered yet. You may call location_get again after a short wait.',
  arguments: { type: 'object', properties: {}, additionalProperties: false },
  result: {
    type: 'object',
    oneOf: [
      {
        type: 'object',
        properties: {
          status: { const: 'GRANTED' },
          latitude: { type: 'number', minimum: -90, maximum: 90 },
          longitude: { type: 'number', minimum: -180, maximum: 180 },
          accuracy: { type: 'number', minimum: 0 },
          timestamp: { type: 'number' },
        },
        required: ['status', 'latitude', 'longitude', 'accuracy', 'timestamp'],
        additionalProperties: false,
      },
      MESSAGE_RESULT_SCHEMA('DECLINED'),
      MESSAGE_RESULT_SCHEMA('PENDING'),
      MESSAGE_RESULT_SCHEMA('UNAVAILABLE'),
    ],
  },
  serve: true,
});

/**
 * @typedef {{status: 'GRANTED', latitude: number, longitude: number, accuracy: number,
 *            timestamp: number}
 *         | {status: 'DECLINED' | 'PENDING' | 'UNAVAILABLE', message: string}} LocationResult
 *
 * The page's own permission card, shown before the browser's prompt.
 * `answer` resolves once with the user's choice; `close(result)` is called once, with the
 * request's final result (GRANTED, DECLINED or UNAVAILABLE), after an `allow` answer settles
 * or right after a `deny`, so the card can show the outcome. `settle()` ends the card without
 * the user (`answer` then resolves 'dismiss').
 * @typedef {{answer: Promise<'allow' | 'deny' | 'dismiss'>, close(result: LocationResult): void,
 *            settle?(): void}} PermissionCard
 * @typedef {() => PermissionCard} AskPermission
 */

const message = (status, text) => ({ status, message: text });

function grantedResult(position, now) {
  const { latitude, longitude, accuracy } = position.coords;
  const timestamp = Number.isFinite(position.timestamp) ? position.timestamp : now();
  return { status: 'GRANTED', latitude, longitude, accuracy, timestamp };
}

function positionErrorResult(error) {
  if (error && error.code === 1) return message('DECLINED', MESSAGES.refused);
  if (error && error.code === 3) return message('UNAVAILABLE', MESSAGES.positionTimeout);
  return message('UNAVAILABLE', MESSAGES.positionUnavailable);
}

/**
 * Builds the page's one location service. Every dependency is injected so the race can be
 * tested with stubs; each defaults to the browser's global.
 *
 * @param {object} options
 * @param {AskPermission} options.askPermission shows GeoSense's own card (see location-card.js)
 * @param {Navigator} [options.navigator]
 * @param {boolean} [options.isSecureContext]
 * @param {(fn: () => void, ms: number) => unknown} [options.setTimeout]
 * @param {(id: unknown) => void} [options.clearTimeout]
 * @param {() => number} [options.now] ms since epoch, for a position without a timestamp
 * @returns {{get(): Promise<LocationResult>, settle(): void,
 *           readonly pendingRequest: Promise<LocationResult> | null}}
 */
export function createLocationService({
  askPermission,
  navigator = globalThis.navigator,
  isSecureContext = globalThis.isSecureContext,
  setTimeout = (fn, ms) => globalThis.setTimeout(fn, ms),
  clearTimeout = (id) => globalThis.clearTimeout(id),
  now = () => Date.now(),
}) {
  if (typeof askPermission !== 'function') {
    throw new TypeError('createLocationService needs an askPermission card');
  }

  /** The one outstanding request (permission query, card, browser request); null when idle. */
  let inFlight = null;
  /** The card of the outstanding request while it is on screen. */
  let openCard = null;

  async function permissionState() {
    if (!navigator.permissions || typeof navigator.permissions.query !== 'function') {
      return 'prompt';
    }
    try {
      const status = await navigator.permissions.query({ name: 'geolocation' });
      return status.state;
    } catch {
      return 'prompt';
    }
  }

  function currentPosition() {
    return new Promise((resolve) => {
      navigator.geolocation.getCurrentPosition(
        (position) => {
          try {
            resolve(grantedResult(position, now));
          } catch {
            resolve(message('UNAVAILABLE', MESSAGES.positionUnavailable));
          }
        },
        (error) => resolve(positionErrorResult(error)),
        { ...GEOLOCATION_OPTIONS },
      );
    });
  }

  async function askThenLocate() {
    const card = askPermission();
    openCard = card;
    const choice = await card.answer;
    if (choice === 'dismiss') return message('PENDING', MESSAGES.pending);
    const result = choice === 'allow'
      ? await currentPosition()
      : message('DECLINED', MESSAGES.notNow);
    if (openCard === card) openCard = null;
    try {
      card.close(result);
    } catch {
      // The card only reports the outcome; a broken card must not change the model's answer.
    }
    return result;
  }

  async function locate() {
    const state = await permissionState();
    if (state === 'denied') return message('DECLINED', MESSAGES.blocked);
    if (state === 'granted') return currentPosition();
    return askThenLocate();
  }

  function startRequest() {
    const request = locate()
      .catch(() => message('UNAVAILABLE', MESSAGES.failed))
      .finally(() => {
        if (inFlight === request) inFlight = null;
      });
    return request;
  }

  /** Each call has its own 5-second timer against the shared request; PENDING if it wins. */
  function race(request) {
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(message('PENDING', MESSAGES.pending)), LOCATION_RACE_MS);
      request.then((result) => {
        clearTimeout(timer);
        resolve(result);
      });
    });
  }

  /** Answers location_get; resolves within LOCATION_RACE_MS and never rejects. */
  async function get() {
    try {
      if (isSecureContext === false) return message('UNAVAILABLE', MESSAGES.insecure);
      if (!navigator || !navigator.geolocation) return message('UNAVAILABLE', MESSAGES.unsupported);
      if (!inFlight) inFlight = startRequest();
      return await race(inFlight);
    } catch {
      return message('UNAVAILABLE', MESSAGES.failed);
    }
  }

  /**
   * End the outstanding request without the user: its turn ended, or the reader switched
   * conversation, so no call waits for its card any more. The card shows PENDING (what the
   * model read) with its buttons disabled, a call still racing answers PENDING, and the next
   * call starts afresh (a new card, or the browser's answer if permission was given meanwhile).
   */
  function settle() {
    const card = openCard;
    openCard = null;
    inFlight = null;
    try {
      card?.settle?.();
    } catch {
      // A broken card must not keep the request open.
    }
  }

  return {
    get,
    settle,
    get pendingRequest() {
      return inFlight;
    },
  };
}
