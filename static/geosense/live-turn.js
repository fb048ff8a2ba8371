// A turn as it happens: its streamed text in a "writing" bubble, its activity log, one-way
// client tools applied to the map, errors as notices. Stored messages are never built here:
// at `message` and `turn_end` the turn is rendered again by the server (transcript.js), and
// only the activity log, which is not stored, stays. While it streams, the bubble shows the
// server's rendering of the text so far (stream-preview.js), plain text only if the server
// cannot render it. Model text only ever reaches the page as textContent or as the server's
// sanitised HTML.

import { activityLogElement, countSteps, entryOfCall } from './activity-log.js';
import { csrfToken } from './http.js';
import { createStreamPreview } from './stream-preview.js';

/** A preview of streaming markup: tags (and a half-written one at the end) left out. */
export function previewText(raw) {
  return raw.replace(/<[^>]*>?/g, '').replace(/\$\{[^}]*\}?/g, '…');
}

/** The "GeoSense is writing" bubble of a streaming answer. */
function bubbleElement(document) {
  const article = document.createElement('article');
  article.className = 'message assistant streaming';
  article.setAttribute('aria-busy', 'true');
  article.setAttribute('aria-label', 'GeoSense is writing');
  const body = document.createElement('div');
  body.className = 'message-body';
  const text = document.createElement('p');
  text.className = 'streaming-text';
  body.append(text);
  article.append(body);
  return article;
}

/**
 * A call in the activity log as a person reads it: the tool's title and the call's summary
 * (the server words both; the name and arguments are for the model), then for a backend call
 * whether it worked, and why not in words (`problem`; `error` is the model's text).
 */
function describeCall(item, data, document) {
  if (data.call_id) item.dataset.callId = data.call_id;
  const title = document.createElement('strong');
  title.className = 'activity-title';
  title.textContent = data.title || data.name;
  item.append(title);
  if (data.summary) {
    const summary = document.createElement('span');
    summary.className = 'activity-summary';
    summary.textContent = data.summary;
    item.append(' — ', summary);
  }
  if (typeof data.ok !== 'boolean') return;
  item.dataset.ok = data.ok ? 'true' : 'false';
  const outcome = document.createElement('span');
  outcome.className = 'activity-outcome';
  outcome.textContent = data.ok ? 'done' : `failed: ${data.problem || data.error || 'no reason given'}`;
  item.append(' — ', outcome);
}

/** The bubble's preview of the text so far: the server's rendering, plain text if it fails. */
function bubblePreview(article, url, document) {
  const body = article.querySelector('.message-body');
  const text = article.querySelector('.streaming-text');
  return createStreamPreview({
    url,
    headers: { 'X-CSRFToken': csrfToken(document) },
    render: (html) => {
      body.innerHTML = html; // the server's rendering, sanitised like every stored message
    },
    fallback: (raw) => {
      text.textContent = previewText(raw);
      body.replaceChildren(text);
    },
  });
}

/**
 * The text written beside a call that paused the turn is shown with its card (the seed: such
 * a message is shown as its card); its copy in the activity log goes, and an empty log too.
 * Returns whether the log went.
 */
function forgetSaid(log, content) {
  const said = (content || '').trim();
  if (!said || !log) return false;
  for (const item of log.querySelectorAll('li.activity-thinking')) {
    if (item.textContent === said) item.remove();
  }
  if (countSteps(log) > 0) return false;
  log.remove();
  return true;
}

/**
 * @param {{
 *   transcript: ReturnType<import('./transcript.js').createTranscript>,
 *   session: () => string | null,         the open session (the preview renders there)
 *   notice: (text: string) => void,
 *   applyOneWay: (name: string, args: object) => void,  a one-way client tool's call
 *   onTurnEnd: () => void,
 *   document?: Document,
 * }} options
 */
export function createLiveTurn({
  transcript,
  session,
  notice,
  applyOneWay,
  onTurnEnd,
  document = globalThis.document,
}) {
  const live = { turn: null, bubble: null, raw: '', log: null, preview: null };

  function bubble() {
    if (live.bubble?.isConnected) return live.bubble;
    const article = bubbleElement(document);
    transcript.turnElement(live.turn).append(article);
    live.bubble = article;
    live.raw = '';
    live.preview = bubblePreview(article, `/chat/${session()}/preview/`, document);
    return article;
  }

  function closeBubble() {
    if (live.bubble) live.bubble.removeAttribute('aria-busy');
    live.preview?.close();
    live.preview = null;
    live.bubble = null;
    live.raw = '';
  }

  function removeBubbles() {
    closeBubble();
    transcript.element.querySelectorAll('.message.streaming').forEach((m) => m.remove());
  }

  function activityLog() {
    if (live.log?.isConnected) return live.log;
    const turn = transcript.turnElement(live.turn);
    // The server's log of the turn (its stored client-tool calls) goes on growing live.
    const stored = turn.querySelector(':scope > .activity-log');
    if (stored) {
      live.log = stored;
      return stored;
    }
    const details = activityLogElement(document);
    const firstUser = turn.querySelector(':scope > .message.user');
    if (firstUser) firstUser.after(details);
    else turn.prepend(details);
    live.log = details;
    return details;
  }

  function logEntry(kind, build) {
    const details = activityLog();
    const item = document.createElement('li');
    item.className = `activity-${kind}`;
    build(item);
    details.querySelector('ol').append(item);
    countSteps(details);
  }

  const handlers = {
    turn_start(data) {
      if (live.turn !== data.turn) {
        live.turn = data.turn;
        live.log = null;
        closeBubble();
      }
      transcript.claimLiveCards(data.turn);
      transcript.renderTurn(data.turn);
      transcript.settleCards(data.turn);
    },
    text_delta(data) {
      if (live.turn === null) return;
      bubble(); // a new bubble starts empty
      live.raw += data.delta || '';
      live.preview.update(live.raw);
    },
    backend_thinking(data) {
      if (live.turn === null) return;
      closeBubble();
      logEntry('thinking', (item) => {
        item.textContent = data.text || '';
      });
    },
    backend_tool_call(data) {
      if (live.turn === null) return;
      closeBubble();
      logEntry('call', (item) => describeCall(item, data, document));
    },
    client_tool_call(data) {
      closeBubble();
      // A call the server's rendering already lists (with its outcome) is not listed twice.
      if (live.turn !== null && !(data.call_id && entryOfCall(activityLog(), data.call_id))) {
        logEntry('client-call', (item) => describeCall(item, data, document));
      }
      if (data.kind === 'one-way') applyOneWay(data.name, data.arguments || {});
    },
    message(data) {
      removeBubbles();
      if (data.pending_approval || data.pending_decision) {
        if (forgetSaid(live.log?.isConnected ? live.log : null, data.content)) live.log = null;
      }
      if (data.turn !== undefined) live.turn = data.turn;
      transcript.renderTurn(live.turn);
    },
    error(data) {
      // The server writes the whole sentence for a person (a provider's failure, a refusal)
      // and keeps it in the transcript as a note: the notice may fade.
      notice(data.message || 'The assistant could not answer.', { fade: true });
    },
    turn_end() {
      removeBubbles();
      transcript.claimLiveCards(live.turn);
      transcript.renderTurn(live.turn);
      onTurnEnd();
    },
  };

  return {
    /**
     * Show one turn event (from this tab's stream, or another tab's turn from the socket).
     *
     * @param {import('./wire.js').EventName} name
     * @param {object} data
     */
    show(name, data) {
      handlers[name]?.(data);
    },
    /** Forget the turn shown live (its bubble and activity log go): it is shown anew. */
    reset() {
      removeBubbles();
      live.log?.remove();
      live.log = null;
      live.turn = null;
    },
    get turn() {
      return live.turn;
    },
    /** The open "writing" bubble of `turn`, carried into the turn when it is re-rendered. */
    bubbleOf(turn) {
      return live.turn === turn && live.bubble?.isConnected ? live.bubble : null;
    },
  };
}
