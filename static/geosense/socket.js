// The tab's one session socket (/ws/chat/): bound to the open chat session, rebound on switch,
// and its client tools registered again after every (re)connect, because a new socket is a new
// consumer on the server that knows nothing of the old one. Every client-tool-invoke is
// answered, even when the handler throws (the model then reads a readable refusal), unless
// the server withdraws it first (client-tool-cancelled: its time-out passed or its turn
// ended): then the handler's signal aborts and no answer is sent. Frames: wire.js.

import {
  CLOSE_CODES,
  SERVER_FRAMES,
  clientToolRegisterFrame,
  clientToolResultFrame,
  sessionBindFrame,
} from './wire.js';

const BACKOFF_MS = [500, 1000, 2000, 4000, 8000, 15000];
// How long a bind waits for the tools to be registered before it lets the caller go on (the
// first message of a new conversation waits, so its turn can call the page's tools).
const BIND_WAIT_MS = 5000;

/** Connection states shown to the user. */
export const SOCKET_STATES = Object.freeze({
  connecting: 'Connecting…',
  connected: 'Connected',
  reconnecting: 'Reconnecting…',
  offline: 'Offline',
});

/** Promises that resolve together on `release()`, each at the latest after its time limit. */
function createWaiters(later, cancelLater) {
  let waiting = [];
  return {
    wait(ms) {
      return new Promise((resolve) => {
        const timer = later(resolve, ms);
        waiting.push(() => {
          cancelLater(timer);
          resolve();
        });
      });
    },
    release() {
      const released = waiting;
      waiting = [];
      released.forEach((release) => release());
    },
  };
}

/**
 * @typedef {{
 *   declaration: import('./wire.js').ClientToolDeclaration,
 *   serve?: (args: object, options: {signal: AbortSignal}) => Promise<object> | object,
 * }} PageTool
 */

/**
 * `onLiveLost`: the server's live channel failed (close code `CLOSE_CODES.liveLost`): show the
 * stored transcript now; the socket reconnects by itself and catches up again once bound.
 * @param {{
 *   url?: string,
 *   session?: string | null,
 *   tools: () => PageTool[],
 *   onEvent?: (name: import('./wire.js').EventName, data: object, seq?: number) => void,
 *   onState?: (state: keyof typeof SOCKET_STATES) => void,
 *   onFrameError?: (frame: import('./wire.js').ErrorFrame) => void,
 *   onBound?: (session: string) => void,
 *   onLiveLost?: () => void,
 *   onCancelled?: (call: {correlationId: string, name: string}) => void,
 *   onAnnotationsChanged?: (revision: string) => void,
 *   WebSocket?: typeof WebSocket,
 *   setTimeout?: typeof setTimeout,
 *   clearTimeout?: typeof clearTimeout,
 * }} options
 */
export function createSessionSocket({
  url = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/ws/chat/`,
  session = null,
  tools,
  onEvent = () => {},
  onState = () => {},
  onFrameError = () => {},
  onBound = () => {},
  onLiveLost = () => {},
  onCancelled = () => {},
  onAnnotationsChanged = () => {},
  WebSocket: Socket = globalThis.WebSocket,
  setTimeout: later = (fn, ms) => globalThis.setTimeout(fn, ms),
  clearTimeout: cancelLater = (id) => globalThis.clearTimeout(id),
}) {
  let socket = null;
  let attempt = 0;
  let timer = null;
  let current = session;
  let stopped = false;
  // Invokes the page is answering: correlation id → {name, controller}.
  const answering = new Map();

  // Callers of bind() waiting for the tools to be registered on the bound session.
  const waiters = createWaiters(later, cancelLater);

  function setReady(value) {
    globalThis.geosenseSocketReady = value;
    if (value) waiters.release();
  }

  function send(frame) {
    if (socket && socket.readyState === Socket.OPEN) socket.send(JSON.stringify(frame));
  }

  function register() {
    send(clientToolRegisterFrame(tools().map((tool) => tool.declaration)));
  }

  async function answer(frame) {
    const tool = tools().find((t) => t.declaration.name === frame.name);
    const controller = new AbortController();
    answering.set(frame.correlationId, { name: frame.name, controller });
    let reply;
    try {
      if (!tool || typeof tool.serve !== 'function') {
        throw new Error(`this page does not answer ${frame.name} by itself`);
      }
      reply = { result: await tool.serve(frame.arguments || {}, { signal: controller.signal }) };
    } catch (error) {
      reply = { error: String(error?.message || error || 'the page failed') };
    }
    if (controller.signal.aborted) return; // withdrawn: the server would refuse the answer
    answering.delete(frame.correlationId);
    send(clientToolResultFrame(frame.correlationId, reply));
  }

  function cancelled(frame) {
    const call = answering.get(frame.correlationId);
    if (!call) return;
    answering.delete(frame.correlationId);
    call.controller.abort();
    onCancelled({ correlationId: frame.correlationId, name: call.name });
  }

  const handlers = {
    [SERVER_FRAMES.sessionBound]: (frame) => {
      if (frame.session !== current) return;
      register();
      onBound(current);
    },
    [SERVER_FRAMES.clientToolRegistered]: () => {
      setReady(true);
      onState('connected');
    },
    [SERVER_FRAMES.clientToolInvoke]: answer,
    [SERVER_FRAMES.clientToolCancelled]: cancelled,
    // Unbound (a new conversation not saved yet): the previous session's events are not ours.
    [SERVER_FRAMES.event]: (frame) => current && onEvent(frame.event, frame.data || {}, frame.seq),
    [SERVER_FRAMES.annotationsChanged]: (frame) => onAnnotationsChanged(String(frame.revision)),
    [SERVER_FRAMES.error]: (frame) => onFrameError(frame),
  };

  function connect() {
    onState(attempt === 0 ? 'connecting' : 'reconnecting');
    socket = new Socket(url);
    socket.addEventListener('open', () => {
      attempt = 0;
      if (current) send(sessionBindFrame(current));
      else onState('connected');
    });
    socket.addEventListener('message', (message) => {
      let frame;
      try {
        frame = JSON.parse(message.data);
      } catch {
        return;
      }
      handlers[frame?.type]?.(frame);
    });
    socket.addEventListener('close', (event) => {
      setReady(false);
      waiters.release(); // a send goes on without the tools rather than hang
      socket = null;
      // The server answered every call this socket held when it closed ("the client went
      // away"); an answer sent on the next socket would be refused as unknown.
      for (const call of answering.values()) call.controller.abort();
      answering.clear();
      if (stopped) return;
      if (event.code === CLOSE_CODES.unauthenticated) return onState('offline'); // log in again
      if (event.code === CLOSE_CODES.liveLost) onLiveLost();
      const delay = BACKOFF_MS[Math.min(attempt, BACKOFF_MS.length - 1)];
      attempt += 1;
      onState(attempt > 3 ? 'offline' : 'reconnecting');
      timer = later(connect, delay);
    });
  }

  connect();
  globalThis.addEventListener?.('online', () => {
    if (!socket && !stopped) {
      cancelLater(timer);
      connect();
    }
  });

  return {
    /** Bind to another session (`null`: a new conversation not saved yet, whose socket
     * ignores the old session's events); resolves once the tools are registered on it (at the
     * latest after BIND_WAIT_MS, or when the socket closes). @returns {Promise<void>} */
    bind(sessionId) {
      current = sessionId || null;
      setReady(false);
      if (!current) return Promise.resolve();
      const ready = waiters.wait(BIND_WAIT_MS);
      if (socket && socket.readyState === Socket.OPEN) {
        onState('connecting');
        send(sessionBindFrame(current));
      }
      return ready;
    },
    close() {
      stopped = true;
      cancelLater(timer);
      socket?.close(1000);
    },
  };
}
