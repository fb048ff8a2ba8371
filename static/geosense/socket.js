// The tab's one session socket (/ws/chat/): bound to the open chat session, rebound on switch,
// and its client tools registered again after every (re)connect, because a new socket is a new
// consumer on the server that knows nothing of the old one. Every client-tool-invoke is
// answered, even when the handler throws (the model then reads a readable refusal).

const BACKOFF_MS = [500, 1000, 2000, 4000, 8000, 15000];
const CLOSE_UNAUTHENTICATED = 4401;

/** Connection states shown to the user. */
export const SOCKET_STATES = Object.freeze({
  connecting: 'Connecting…',
  connected: 'Connected',
  reconnecting: 'Reconnecting…',
  offline: 'Offline',
});

/**
 * @param {{
 *   url?: string,
 *   session?: string | null,
 *   tools: () => Array<{declaration: object, serve?: (args: object) => Promise<object> | object}>,
 *   onEvent?: (name: string, data: object) => void,
 *   onState?: (state: keyof typeof SOCKET_STATES) => void,
 *   onFrameError?: (frame: object) => void,
 *   onBound?: (session: string) => void,
 *   WebSocket?: typeof WebSocket,
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
  WebSocket: Socket = globalThis.WebSocket,
}) {
  let socket = null;
  let attempt = 0;
  let timer = null;
  let current = session;
  let stopped = false;

  function setReady(value) {
    globalThis.geosenseSocketReady = value;
  }

  function send(frame) {
    if (socket && socket.readyState === Socket.OPEN) socket.send(JSON.stringify(frame));
  }

  function register() {
    send({ type: 'client-tool-register', tools: tools().map((tool) => tool.declaration) });
  }

  async function answer(frame) {
    const tool = tools().find((t) => t.declaration.name === frame.name);
    const reply = { type: 'client-tool-result', correlationId: frame.correlationId };
    try {
      if (!tool || typeof tool.serve !== 'function') {
        throw new Error(`this page does not answer ${frame.name} by itself`);
      }
      reply.result = await tool.serve(frame.arguments || {});
    } catch (error) {
      reply.error = String(error?.message || error || 'the page failed');
    }
    send(reply);
  }

  const handlers = {
    'session-bound': (frame) => {
      if (frame.session !== current) return;
      register();
      onBound(current);
    },
    'client-tool-registered': () => {
      setReady(true);
      onState('connected');
    },
    'client-tool-invoke': answer,
    event: (frame) => onEvent(frame.event, frame.data || {}),
    error: (frame) => onFrameError(frame),
  };

  function connect() {
    onState(attempt === 0 ? 'connecting' : 'reconnecting');
    socket = new Socket(url);
    socket.addEventListener('open', () => {
      attempt = 0;
      if (current) send({ type: 'session-bind', session: current });
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
      socket = null;
      if (stopped) return;
      if (event.code === CLOSE_UNAUTHENTICATED) {
        onState('offline');
        return;
      }
      const delay = BACKOFF_MS[Math.min(attempt, BACKOFF_MS.length - 1)];
      attempt += 1;
      onState(attempt > 3 ? 'offline' : 'reconnecting');
      timer = setTimeout(connect, delay);
    });
  }

  connect();
  globalThis.addEventListener?.('online', () => {
    if (!socket && !stopped) {
      clearTimeout(timer);
      connect();
    }
  });

  return {
    /** Bind the socket to another session (a session switch); registers the tools again. */
    bind(sessionId) {
      current = sessionId;
      setReady(false);
      if (socket && socket.readyState === Socket.OPEN) {
        onState('connecting');
        send({ type: 'session-bind', session: sessionId });
      }
    },
    /** Re-send the tool declarations (e.g. after the page's tools changed). */
    register,
    get session() {
      return current;
    },
    close() {
      stopped = true;
      clearTimeout(timer);
      socket?.close(1000);
    },
  };
}
