// Stubs for the location tests: a manual clock, a browser navigator whose permission state
// and geolocation callbacks the test drives, a permission card the test answers, and a tiny
// DOM. Not a test file itself (no `.test.` in the name).

/** Lets every pending promise callback run. */
export const flush = () => new Promise((resolve) => setImmediate(resolve));

/** Tracks whether a promise has settled yet, to assert "not before". */
export function track(promise) {
  const tracked = { settled: false, value: undefined };
  tracked.promise = promise.then((value) => {
    tracked.settled = true;
    tracked.value = value;
    return value;
  });
  return tracked;
}

/** The call's result once pending callbacks ran; fails (instead of hanging) if it has none. */
export async function answered(tracked) {
  await flush();
  if (!tracked.settled) throw new Error('the call has not answered');
  return tracked.value;
}

/** A clock whose timers only fire on `advance`; `pending()` tells leaked timers. */
export function fakeClock(start = 1_750_000_000_000) {
  let time = start;
  let nextId = 1;
  const timers = new Map();
  return {
    setTimeout(fn, ms) {
      const id = nextId++;
      timers.set(id, { fn, at: time + ms });
      return id;
    },
    clearTimeout(id) {
      timers.delete(id);
    },
    now: () => time,
    pending: () => timers.size,
    async advance(ms) {
      const until = time + ms;
      for (;;) {
        const due = [...timers.entries()]
          .filter(([, timer]) => timer.at <= until)
          .sort((a, b) => a[1].at - b[1].at)[0];
        if (!due) break;
        const [id, timer] = due;
        timers.delete(id);
        time = timer.at;
        timer.fn();
        await flush();
      }
      time = until;
      await flush();
    },
  };
}

/**
 * A navigator with permissions and geolocation. `state` is what permissions.query answers;
 * a successful position flips it to 'granted', as a browser remembers the grant.
 */
export function fakeNavigator({ state = 'prompt', permissions = true, geolocation = true } = {}) {
  const requests = [];
  const queries = [];
  const nav = {};
  const browser = {
    state,
    nav,
    queries,
    requests,
    /** Calls the oldest unanswered request's success callback. */
    succeed({ latitude = 52.52, longitude = 13.405, accuracy = 25, timestamp = 1_750_000_000_123 } = {}) {
      const request = requests.find((r) => !r.answered);
      request.answered = true;
      browser.state = 'granted';
      request.success({ coords: { latitude, longitude, accuracy }, timestamp });
    },
    /** Calls the oldest unanswered request's error callback with a GeolocationPositionError code. */
    fail(code) {
      const request = requests.find((r) => !r.answered);
      request.answered = true;
      if (code === 1) browser.state = 'denied';
      request.error({ code, message: `error ${code}` });
    },
  };
  if (permissions) {
    nav.permissions = {
      async query(descriptor) {
        queries.push(descriptor);
        return { state: browser.state, name: descriptor.name };
      },
    };
  }
  if (geolocation) {
    nav.geolocation = {
      getCurrentPosition(success, error, options) {
        requests.push({ success, error, options, answered: false });
      },
    };
  }
  return browser;
}

/** An askPermission whose cards the test answers; records every card shown and its outcome. */
export function fakeCards() {
  const shown = [];
  const askPermission = () => {
    let resolve;
    const answer = new Promise((r) => {
      resolve = r;
    });
    const card = {
      closed: [],
      allow: () => resolve('allow'),
      deny: () => resolve('deny'),
    };
    shown.push(card);
    return { answer, close: (result) => card.closed.push(result) };
  };
  return { shown, askPermission };
}

class FakeElement {
  constructor(tagName) {
    this.tagName = tagName.toUpperCase();
    this.attributes = new Map();
    this.children = [];
    this.parent = null;
    this.listeners = new Map();
    this.ownText = '';
    this.className = '';
    this.disabled = false;
  }

  setAttribute(name, value) {
    this.attributes.set(name, String(value));
  }

  getAttribute(name) {
    return this.attributes.has(name) ? this.attributes.get(name) : null;
  }

  set textContent(value) {
    this.children = [];
    this.ownText = String(value);
  }

  get textContent() {
    return this.ownText + this.children.map((child) => child.textContent).join('');
  }

  appendChild(child) {
    child.remove();
    child.parent = this;
    this.children.push(child);
    return child;
  }

  remove() {
    if (!this.parent) return;
    this.parent.children = this.parent.children.filter((child) => child !== this);
    this.parent = null;
  }

  addEventListener(type, listener) {
    if (!this.listeners.has(type)) this.listeners.set(type, []);
    this.listeners.get(type).push(listener);
  }

  /** Like a real click: a disabled button fires no click listeners. */
  click() {
    if (this.disabled) return;
    for (const listener of this.listeners.get('click') ?? []) listener({ type: 'click', target: this });
  }

  /** Finds a descendant by data-testid, or null. */
  byTestId(testid) {
    for (const child of this.children) {
      if (child.getAttribute('data-testid') === testid) return child;
      const found = child.byTestId(testid);
      if (found) return found;
    }
    return null;
  }
}

/** Just enough of `document` for location-card.js. */
export function fakeDocument() {
  return { createElement: (tag) => new FakeElement(tag) };
}

/**
 * Checks a value against the JSON Schema subset LOCATION_TOOL uses (type, const, enum,
 * minimum, maximum, properties, required, additionalProperties, oneOf); returns error strings.
 */
export function schemaErrors(schema, value, path = '$') {
  const errors = [];
  if (schema.type === 'object' && (typeof value !== 'object' || value === null || Array.isArray(value))) {
    return [`${path}: not an object`];
  }
  if (schema.type === 'number' && !Number.isFinite(value)) return [`${path}: not a number`];
  if (schema.type === 'string' && typeof value !== 'string') return [`${path}: not a string`];
  if ('const' in schema && value !== schema.const) errors.push(`${path}: not ${schema.const}`);
  if (schema.enum && !schema.enum.includes(value)) errors.push(`${path}: not in enum`);
  if (schema.minimum !== undefined && value < schema.minimum) errors.push(`${path}: below minimum`);
  if (schema.maximum !== undefined && value > schema.maximum) errors.push(`${path}: above maximum`);
  for (const key of schema.required ?? []) {
    if (!(key in value)) errors.push(`${path}: missing ${key}`);
  }
  for (const [key, sub] of Object.entries(schema.properties ?? {})) {
    if (key in value) errors.push(...schemaErrors(sub, value[key], `${path}.${key}`));
  }
  if (schema.additionalProperties === false) {
    for (const key of Object.keys(value)) {
      if (!(key in (schema.properties ?? {}))) errors.push(`${path}: unexpected ${key}`);
    }
  }
  if (schema.oneOf) {
    const matching = schema.oneOf.filter((sub) => schemaErrors(sub, value, path).length === 0);
    if (matching.length !== 1) errors.push(`${path}: matches ${matching.length} of oneOf`);
  }
  return errors;
}

/** Every key anywhere in a schema, to prove no `pattern`/`patternProperties` is present. */
export function schemaKeys(schema) {
  if (!schema || typeof schema !== 'object') return [];
  return Object.entries(schema).flatMap(([key, value]) => [key, ...schemaKeys(value)]);
}
