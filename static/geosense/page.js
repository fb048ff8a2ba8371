// The chat page's entry: one map, one socket and the chat of the open session. Switching
// sessions swaps only the chat panel (htmx), so the map and the socket stay and the socket is
// rebound to the new session, which registers the page's client tools again.

import { createChat } from './chat.js';
import { createLocationCard } from './location-card.js';
import { createLocationService } from './location.js';
import { createAnnotationMap } from './map.js';
import { pageClientTools } from './page-tools.js';
import { SOCKET_STATES, createSessionSocket } from './socket.js';

const map = createAnnotationMap(document.getElementById('map'));
window.geosenseMap = map;

// One location service per page: it survives session switches, so a request still open
// (a card nobody answered yet) is joined, never doubled. Its card goes into the transcript
// on screen when it is asked for.
const location = createLocationService({
  askPermission: () => createLocationCard({ container: document.getElementById('transcript') })(),
});
const tools = pageClientTools({ map, location });

const badge = document.getElementById('connection-state');
let chat = null;

function showState(state) {
  badge.dataset.state = state;
  badge.textContent = SOCKET_STATES[state];
}

function refreshSessionList(sessionId) {
  window.htmx?.ajax('GET', `/chat/${sessionId}/`, {
    target: '#sessions',
    select: '#sessions',
    swap: 'outerHTML',
  });
  window.htmx?.ajax('GET', `/chat/${sessionId}/`, {
    target: '#page-title',
    select: '#page-title',
    swap: 'outerHTML',
  });
}

function mount(panel) {
  panel.dataset.mounted = 'true';
  chat = createChat({
    panel,
    map,
    tools,
    onSessionCreated: (id) => socket.bind(id),
    onTitleMaybeChanged: (id) => {
      panel.dataset.sessionTitle = '-';
      refreshSessionList(id);
    },
  });
}

const panel = document.getElementById('chat-panel');
const socket = createSessionSocket({
  session: panel.dataset.sessionId || null,
  tools: () => tools,
  onEvent: (name, data) => chat?.onSocketEvent(name, data),
  onBound: () => chat?.catchUp(),
  onState: showState,
  onFrameError: (frame) => {
    if (frame.status !== 404) console.warn('GeoSense socket:', frame.error);
  },
});
mount(panel);

document.body.addEventListener('htmx:afterSettle', (event) => {
  const swapped = document.getElementById('chat-panel');
  if (!swapped || swapped.dataset.mounted === 'true') return;
  mount(swapped);
  map.clearHighlight?.();
  socket.bind(swapped.dataset.sessionId);
});
