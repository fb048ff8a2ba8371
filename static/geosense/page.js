// The chat page's entry: one map, one socket and the chat of the open session. Switching
// sessions swaps only the chat panel (htmx), so the map and the socket stay and the socket is
// rebound to the new session, which registers the page's client tools again.

import { createChat } from './chat.js';
import { createLocationCard } from './location-card.js';
import { wireLayout } from './layout.js';
import { createLocationService } from './location.js';
import { createAnnotationMap } from './map.js';
import { pageClientTools } from './page-tools.js';
import { guardPanelSwaps } from './panel-swaps.js';
import { groupSessionList } from './sessions-list.js';
import { SOCKET_STATES, createSessionSocket } from './socket.js';
import { placeLiveCard } from './transcript.js';

wireLayout({ main: document.querySelector('.chat-layout') });
const map = createAnnotationMap(document.getElementById('map'));
window.geosenseMap = map;

// One location service per page: a request still open (a card nobody answered yet) is joined,
// never doubled. Its card goes into the running turn (the last) of the transcript on screen;
// the request is settled when that turn ends or the reader switches conversation, so a card
// never outlives the calls it answers.
function runningTurn() {
  const transcript = document.getElementById('transcript');
  const turns = transcript.querySelectorAll(':scope > .turn');
  return turns[turns.length - 1] || transcript;
}
const location = createLocationService({
  askPermission: () => createLocationCard({ place: (card) => placeLiveCard(runningTurn(), card) })(),
});
const tools = pageClientTools({ map, location });

const badge = document.getElementById('connection-state');
const panelSwaps = guardPanelSwaps({
  body: document.body,
  draft: () => document.getElementById('composer-text')?.value ?? '',
});
let chat = null;

function showState(state) {
  badge.dataset.state = state;
  badge.textContent = SOCKET_STATES[state];
}

// Sessions with an answer the reader has not seen: a turn of theirs ended after the reader
// switched away. Their entry in the list gets a dot; the header and the selection stay.
const newAnswers = new Set();

function markNewAnswers() {
  for (const link of document.querySelectorAll('.session-list a[data-session-id]')) {
    const fresh = newAnswers.has(link.dataset.sessionId);
    link.querySelector('.new-answer-dot')?.remove();
    if (fresh) {
      link.dataset.newAnswer = 'true';
      const dot = document.createElement('span');
      dot.className = 'new-answer-dot';
      dot.title = 'New answer';
      const words = document.createElement('span');
      words.className = 'visually-hidden';
      words.textContent = '(new answer)';
      dot.append(words);
      link.append(dot);
    } else {
      delete link.dataset.newAnswer;
    }
  }
}

/** The list of sessions (and with `title`, the header) as the open session's page has them. */
function refreshSessionList({ title = false } = {}) {
  const id = document.getElementById('chat-panel')?.dataset.sessionId;
  const url = id ? `/chat/${id}/` : '/chat/';
  const parts = title ? ['#sessions', '#page-title'] : ['#sessions'];
  for (const part of parts) {
    window.htmx?.ajax('GET', url, { target: part, select: part, swap: 'outerHTML' });
  }
}

function mount(panel) {
  panel.dataset.mounted = 'true';
  const mounted = createChat({
    panel,
    map,
    tools,
    // A panel swapped away while its first message was being saved does not take the socket
    // back from the conversation on screen: its turn runs on, and ends as a new-answer dot.
    onSessionCreated: (id) => (chat === mounted ? socket.bind(id) : undefined),
    onSend: () => chat === mounted && panelSwaps.acted(),
    onTurnEnd: ({ session, untitled }) => {
      if (chat !== mounted) {
        // A conversation the reader left: mark it, keep the header and the selection.
        newAnswers.add(session);
        refreshSessionList();
        return;
      }
      location.settle();
      if (untitled) {
        panel.dataset.sessionTitle = '-';
        refreshSessionList({ title: true });
      }
    },
  });
  chat = mounted;
  newAnswers.delete(panel.dataset.sessionId);
  markNewAnswers();
}

const panel = document.getElementById('chat-panel');
const socket = createSessionSocket({
  session: panel.dataset.sessionId || null,
  tools: () => tools,
  onEvent: (name, data, seq) => chat?.onSocketEvent(name, data, seq),
  onBound: () => chat?.catchUp(),
  onLiveLost: () => chat?.catchUp(),
  onState: showState,
  onFrameError: (frame) => {
    if (frame.status !== 404) console.warn('GeoSense socket:', frame.error);
  },
  // Annotations were written (here or anywhere): the map reloads its counts and tiles.
  onAnnotationsChanged: (revision) =>
    document.dispatchEvent(
      new CustomEvent('geosense:annotations-changed', { detail: { revision } }),
    ),
});
mount(panel);

// The conversations list is grouped by the reader's days; swaps bring it back flat.
const groupSessions = () => groupSessionList(document.querySelector('#sessions .session-list'));
groupSessions();
setInterval(groupSessions, 60_000);
document.body.addEventListener('htmx:oobAfterSwap', groupSessions);

// A swapped-in panel is mounted at once (not when htmx settles, 20 ms or more later): its
// composer must not meet a Send before it is wired.
function mountSwapped() {
  const swapped = document.getElementById('chat-panel');
  if (!swapped || swapped.dataset.mounted === 'true') return;
  location.settle(); // its card left with the old panel; the server's card records the call
  mount(swapped);
  map.clearHighlight?.();
  socket.bind(swapped.dataset.sessionId || null);
  const text = panelSwaps.takeDraft(); // typed while it loaded: the reader goes on typing
  const box = swapped.querySelector('#composer-text');
  if (text && box) {
    box.value = text;
    box.focus();
    box.setSelectionRange(text.length, text.length);
  }
}
document.body.addEventListener('htmx:afterSwap', mountSwapped);
document.body.addEventListener('htmx:afterSettle', () => {
  groupSessions();
  markNewAnswers();
  mountSwapped();
});
