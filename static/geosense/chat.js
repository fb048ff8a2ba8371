// The chat panel of the page: the composer and the turns this tab starts, and the socket's
// live events of the open session. It wires the parts, each a module of its own:
// session.js (the open session and its toggle), transcript.js (the server's rendering),
// live-turn.js (a turn as it happens), turn-stream.js (sending; this tab's turns over SSE),
// own-turns.js (which of the socket's events this tab has already shown), actions.js (what
// the reader does in the transcript), notices.js and http.js.

import { applyHighlight, wireTranscriptActions } from './actions.js';
import { errorText, request } from './http.js';
import { createLiveTurn } from './live-turn.js';
import { createNotices } from './notices.js';
import { createOwnTurns } from './own-turns.js';
import { createSessionState } from './session.js';
import { createTranscript } from './transcript.js';
import { createTurnSender } from './turn-stream.js';

/**
 * Wires the chat panel of the page.
 *
 * @param {{
 *   panel: HTMLElement,
 *   map: object,                 window.geosenseMap (map.js)
 *   tools: Array & {applyOneWay(name: string, args: object): boolean},
 *   onSessionCreated?: (id: string) => Promise<void> | void,  resolves once the socket is bound
 *   onSend?: () => void,         the reader sends or resumes in this panel (page.js: a panel
 *     swap asked for before it is not done, panel-swaps.js)
 *   onTurnEnd?: (ended: {session: string | null, untitled: boolean}) => void,  a turn this
 *     panel showed ended (`untitled`: the session had no title yet, so it may have one now)
 *   document?: Document,
 * }} options
 */
export function createChat({
  panel,
  map,
  tools,
  onSessionCreated = () => {},
  onSend = () => {},
  onTurnEnd = () => {},
  document = globalThis.document,
}) {
  const sendButton = panel.querySelector('#send-button');
  const stopButton = panel.querySelector('#stop-button');
  const credits = panel.querySelector('#credits');
  const ownTurns = createOwnTurns();
  const notice = createNotices({ container: panel.querySelector('#notices'), document });
  const session = createSessionState({ panel, notice, onCreated: onSessionCreated, document });

  const mapReady = () => whenMapReady(map);
  // A turn of a conversation the reader has left (its own stream still runs) never moves the
  // map: only the panel on screen does.
  const onScreen = () => panel.isConnected;
  /** What a live update changed beside the transcript: the credits, the toggle. */
  function applyState(response) {
    const balance = response.headers.get('X-GeoSense-Credits');
    if (balance !== null && credits) credits.textContent = balance;
    session.applyState(response);
  }

  const transcript = createTranscript({
    element: panel.querySelector('#transcript'),
    session: () => session.id,
    onState: applyState,
    onHighlight: (block) => onScreen() && applyHighlight(actions, block),
    keep: (turn) => liveTurn.bubbleOf(turn),
    document,
  });
  const liveTurn = createLiveTurn({
    transcript,
    session: () => session.id,
    notice,
    applyOneWay: (name, args) => onScreen() && mapReady().then(() => tools.applyOneWay(name, args)),
    onTurnEnd: () => onTurnEnd({ session: session.id, untitled: panel.dataset.sessionTitle === '' }),
    document,
  });

  function setBusy(value) {
    panel.dataset.busy = value ? 'true' : 'false';
    sendButton.disabled = value;
    if (stopButton) {
      stopButton.hidden = !value;
      stopButton.disabled = false;
    }
    transcript.element.setAttribute('aria-busy', value ? 'true' : 'false');
  }

  const sender = createTurnSender({
    session,
    ownTurns,
    show: liveTurn.show,
    render: transcript.renderTurn,
    currentTurn: () => liveTurn.turn,
    notice,
    setBusy,
    document,
  });
  const send = (text, options) => {
    onSend();
    return sender.send(text, options);
  };
  const resume = (payload, options) => {
    onSend();
    return sender.resume(payload, options);
  };

  /** @type {import('./actions.js').Chat} */
  const actions = {
    element: transcript.element,
    map,
    mapReady,
    tools,
    notice,
    session: () => session.id,
    ensureSession: session.ensure,
    send,
    resume,
    renderMessage: transcript.renderMessage,
    document,
  };
  wireTranscriptActions(actions);

  if (stopButton) wireStop({ button: stopButton, session, notice, document });
  wireComposer({
    composer: panel.querySelector('#composer'),
    textarea: panel.querySelector('#composer-text'),
    send,
    busy: () => panel.dataset.busy === 'true',
    notice,
  });
  transcript.scrollToEnd();

  // A turn that was already running when this tab started following the session (a reload,
  // a switch back, a lost socket): its progress so far is read once (`seq`: its last event),
  // then the socket's events after it are shown; those that arrive while it is read wait.
  const running = { seq: null, waiting: null };

  function showSocketEvent(name, data, seq) {
    if (running.seq !== null && typeof seq === 'number' && name !== 'turn_start' && seq <= running.seq) {
      return; // already shown from the turn's progress
    }
    if (name === 'turn_start') running.seq = null;
    const own = ownTurns.socketEventIsOwn(name, data);
    if (!own) liveTurn.show(name, data);
    // Another tab's turn (or one already running): Send waits until it ends.
    if (name === 'turn_start' && !own) setBusy(true);
    if (name === 'turn_end' && !ownTurns.streaming) setBusy(false);
  }

  return {
    /** A live event of the bound session from the socket; other tabs' turns are shown here. */
    onSocketEvent(name, data, seq) {
      if (running.waiting) running.waiting.push([name, data, seq]);
      else showSocketEvent(name, data, seq);
    },
    /**
     * After a (re)bind: show what was stored while this tab was not listening (a reload or a
     * lost socket mid-turn) by rendering the latest turns again from the server, and a turn
     * still running as it is so far, followed live to its end (Send waits for it).
     */
    async catchUp() {
      if (!session.id || ownTurns.streaming) return;
      running.waiting = [];
      try {
        await renderStoredTurns(session.id, transcript);
        const progress = ownTurns.streaming ? null : await runningTurn(session.id);
        if (progress && !ownTurns.streaming) {
          setBusy(true);
          liveTurn.reset();
          for (const { event, data } of progress.events) liveTurn.show(event, data);
          running.seq = progress.seq;
        } else if (!ownTurns.streaming) {
          setBusy(false);
        }
      } finally {
        const waiting = running.waiting;
        running.waiting = null;
        for (const [name, data, seq] of waiting) showSocketEvent(name, data, seq);
      }
    },
  };
}

// Messages read back after a (re)bind: the turns among them not yet on the page are rendered.
const CATCH_UP_MESSAGES = 100;

/** Render again the latest stored turns from the last one on the page on. */
async function renderStoredTurns(sessionId, transcript) {
  const response = await fetch(`/api/sessions/${sessionId}?limit=${CATCH_UP_MESSAGES}`, {
    credentials: 'same-origin',
  });
  const turns = response.ok ? new Set((await response.json()).messages.map((m) => m.turn)) : [];
  const shown = transcript.shownTurns();
  const latestShown = shown.length ? Math.max(...shown) : -1;
  for (const turn of [...turns].sort((a, b) => a - b)) {
    if (turn >= latestShown) await transcript.renderTurn(turn);
  }
}

/** The session's running turn so far (docs/protocol.md, "A turn already running"), or null. */
async function runningTurn(sessionId) {
  const response = await fetch(`/chat/${sessionId}/progress/`, { credentials: 'same-origin' });
  if (!response.ok) return null;
  const progress = await response.json();
  return progress.running ? progress : null;
}

/** `map.ready` is a promise until the annotations are drawn, then true. */
async function whenMapReady(map) {
  if (typeof map.ready?.then === 'function') await map.ready;
}

/**
 * The Stop button, shown while this tab's turn runs: the server cancels the turn; the stream
 * then ends as every turn does (`turn_end`), and what was written stays, marked cut off.
 */
function wireStop({ button, session, notice, document }) {
  button.addEventListener('click', async () => {
    if (!session.id) return;
    button.disabled = true;
    try {
      const response = await request(`/api/sessions/${session.id}/stop`, {
        method: 'POST',
        document,
      });
      if (!response.ok) {
        notice(`Could not stop the answer: ${await errorText(response)}.`);
        button.disabled = false;
      }
    } catch {
      notice('The server could not be reached to stop the answer.');
      button.disabled = false;
    }
  });
}

/** The composer: Enter sends, Shift+Enter breaks the line, a refused text comes back. */
function wireComposer({ composer, textarea, send, busy, notice }) {
  composer.addEventListener('submit', async (event) => {
    event.preventDefault();
    const text = textarea.value;
    if (!text.trim()) return;
    if (busy()) {
      notice('Wait until the current answer is finished.');
      return; // the text stays in the box
    }
    textarea.value = '';
    const restore = () => {
      // Nothing the user typed is lost: give the text back, before anything typed since.
      textarea.value = textarea.value ? `${text}\n${textarea.value}` : text;
      textarea.focus();
    };
    await send(text, { onRefused: restore });
  });
  textarea.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      composer.requestSubmit();
    }
  });
}
