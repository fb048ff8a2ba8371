// The turns this tab starts or resumes, followed over their own Server-Sent Events response.
// The POST answers either a 4xx JSON refusal before any stream, or the turn's events
// (docs/protocol.md); the turn runs on the server whatever happens to this connection.
// `followTurn` is the transport; `createTurnSender` sends messages and resumes, one at a time,
// tells the own-turn pairing (own-turns.js) about its stream and shows its events.

import { SSE as DefaultSSE } from '../vendor/sse/sse.js';
import { csrfToken } from './http.js';
import { TURN_EVENTS } from './wire.js';

/**
 * POST `payload` to `url` and follow the turn's events. Resolves true once the stream has
 * ended when the turn started, false when it never did (refused, or the server unreachable).
 *
 * @param {string} url
 * @param {object} payload
 * @param {{
 *   onEvent: (name: import('./wire.js').EventName, data: object) => void,
 *   onRefused: (text: string) => void,  the server refused (4xx) before any stream
 *   onUnreachable: () => void,          the request failed before the turn started
 *   onLost: () => void,                 the connection broke after the turn started
 *   onClosedEarly: () => void,          the stream ended after turn_start, before turn_end
 *   document?: Document,
 *   SSE?: typeof DefaultSSE,
 * }} handlers
 * @returns {Promise<boolean>}
 */
export function followTurn(url, payload, handlers) {
  const { onEvent, onRefused, onUnreachable, onLost, onClosedEarly } = handlers;
  const { document = globalThis.document, SSE = DefaultSSE } = handlers;
  return new Promise((resolve) => {
    let started = false;
    let ended = false;
    const source = new SSE(url, {
      headers: { 'Content-Type': 'application/json', 'X-CSRFToken': csrfToken(document) },
      payload: JSON.stringify(payload),
      method: 'POST',
      start: false,
    });
    const finish = () => {
      if (ended) return;
      ended = true;
      source.close();
      resolve(started);
    };
    for (const name of TURN_EVENTS) {
      source.addEventListener(name, (event) => {
        if (name === 'error' && 'responseCode' in event) return; // the transport, below
        let data;
        try {
          data = JSON.parse(event.data || '{}');
        } catch {
          return;
        }
        if (name === 'turn_start') started = true;
        onEvent(name, data);
        if (name === 'turn_end') finish();
      });
    }
    source.addEventListener('error', (event) => {
      if (!('responseCode' in event) || ended) return;
      if (event.responseCode >= 400) onRefused(refusalText(event));
      else if (started) onLost();
      else onUnreachable();
      finish();
    });
    source.addEventListener('readystatechange', (event) => {
      if (event.readyState === SSE.CLOSED && !ended) {
        if (started) onClosedEarly();
        finish();
      }
    });
    source.stream();
  });
}

function refusalText(event) {
  try {
    return JSON.parse(event.data).error || `the server answered ${event.responseCode}`;
  } catch {
    return `the server answered ${event.responseCode}`;
  }
}

/**
 * Sends this tab's messages and resumes, one turn at a time.
 *
 * @param {{
 *   session: {readonly id: string | null, ensure(): Promise<string>},
 *   ownTurns: import('./own-turns.js').OwnTurns,
 *   show: (name: import('./wire.js').EventName, data: object) => void,  show an event
 *   render: (turn: number | null) => void,  render a turn from the server
 *   currentTurn: () => number | null,       the turn being shown live
 *   notice: (text: string) => void,
 *   setBusy: (busy: boolean) => void,
 *   document?: Document,
 * }} options
 */
export function createTurnSender(options) {
  const { session, ownTurns, show, render, currentTurn, notice, setBusy, document } = options;
  // A turn the pairing took for this tab's own wrongly is rendered from the server.
  const renderGivenBack = (turn) => turn !== null && render(turn);

  /** Resolves true when the turn started, false when it never did (then `onRefused` ran). */
  async function stream(url, payload, onRefused) {
    ownTurns.streamOpened();
    setBusy(true);
    const started = await followTurn(url, payload, {
      onEvent: (name, data) => {
        if (name === 'turn_start') renderGivenBack(ownTurns.streamStarted(data.turn));
        show(name, data);
      },
      onRefused: (text) => {
        notice(`Not sent: ${text}.`);
        onRefused();
      },
      onUnreachable: () => {
        notice('The server could not be reached. Your message was not sent.');
        onRefused();
      },
      onLost: () => {
        notice('The connection was lost while the answer was written; it continues on the server.', {
          kind: 'status',
        });
        ownTurns.streamLost(); // the socket's events take over
      },
      onClosedEarly: () => render(currentTurn()),
      document,
    });
    renderGivenBack(ownTurns.streamClosed({ started }));
    setBusy(false);
    return started;
  }

  return {
    /** Send a user message (with data contexts); resolves true once its turn started. */
    async send(text, { contexts = [], onRefused = () => {} } = {}) {
      if (ownTurns.streaming) {
        notice('Wait until the current answer is finished.', { kind: 'status' });
        onRefused();
        return false;
      }
      try {
        await session.ensure();
      } catch (error) {
        notice(`Could not start a conversation: ${error.message}`);
        onRefused();
        return false;
      }
      const payload = contexts.length ? { text, contexts } : { text };
      return stream(`/api/sessions/${session.id}/message/stream`, payload, onRefused);
    },
    /** Resume a paused turn with an approval decision or a reader's answer. */
    resume(payload, { onRefused = () => {} } = {}) {
      return stream(`/api/sessions/${session.id}/message/resume/stream`, payload, onRefused);
    },
  };
}
