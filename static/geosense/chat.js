// The chat of the page: the composer, the turn streams, the cards and the blocks' actions.
//
// Live and reloaded views are the same because every stored message is shown as the server
// renders it: while a turn streams, its text shows in a "streaming" bubble, and
// at `message`/`turn_end` the whole turn is fetched again from /chat/<id>/turns/<n>/ and
// swapped in. While it streams, the bubble shows the server's rendering of the text so far
// (stream-preview.js), plain text only if the server cannot render it. Only the activity log is built here, from the events, and never stored.
// Model text only ever reaches the page as textContent or as the server's escaped HTML.

import { SSE } from '../vendor/sse/sse.js';
import { createStreamPreview } from './stream-preview.js';

const TURN_EVENTS = [
  'turn_start',
  'text_delta',
  'backend_thinking',
  'backend_tool_call',
  'client_tool_call',
  'message',
  'error',
  'turn_end',
];

/** `<answer …>` as chat/markup/compose.py writes it; no index for an answer in own words. */
export function composeAnswer(questionId, optionIndex, message) {
  const index = Number.isInteger(optionIndex) ? ` question-option-index="${optionIndex}"` : '';
  return `<answer question="${escapeAttribute(questionId)}"${index}>${escapeText(message.trim())}</answer>`;
}

/** The seed's `<response type="find_similar">` with its readable sentence. */
export function composeResponse(classId, requestId, count) {
  const sentence =
    `Find Similar located ${count} result${count === 1 ? '' : 's'} belonging to class ${classId}.`;
  return (
    `<response type="find_similar" class-id="${escapeAttribute(classId)}" ` +
    `request="${escapeAttribute(requestId)}">${escapeText(sentence)}</response>`
  );
}

function escapeText(text) {
  return String(text).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

function escapeAttribute(text) {
  return escapeText(text).replace(/"/g, '&quot;').replace(/'/g, '&#x27;');
}

/** A preview of streaming markup: tags (and a half-written one at the end) left out. */
function previewText(raw) {
  return raw.replace(/<[^>]*>?/g, '').replace(/\$\{[^}]*\}?/g, '…');
}

function csrfToken(document) {
  try {
    return JSON.parse(document.body.getAttribute('hx-headers') || '{}')['x-csrftoken'] || '';
  } catch {
    return '';
  }
}

function fragment(document, html) {
  const template = document.createElement('template');
  template.innerHTML = html.trim();
  return template.content;
}

/**
 * Wires the chat panel of the page.
 *
 * @param {{
 *   panel: HTMLElement,
 *   map: object,                 window.geosenseMap (map.js)
 *   tools: Array & {applyOneWay(name: string, args: object): boolean},
 *   onSessionCreated?: (id: string) => void,
 *   onTitleMaybeChanged?: (id: string) => void,
 *   document?: Document,
 * }} options
 */
export function createChat({
  panel,
  map,
  tools,
  onSessionCreated = () => {},
  onTitleMaybeChanged = () => {},
  document = globalThis.document,
}) {
  const transcript = panel.querySelector('#transcript');
  const notices = panel.querySelector('#notices');
  const composer = panel.querySelector('#composer');
  const textarea = panel.querySelector('#composer-text');
  const sendButton = panel.querySelector('#send-button');
  const toggle = panel.querySelector('#allow-backend-tools');
  const credits = panel.querySelector('#credits');

  let sessionId = panel.dataset.sessionId || null;
  let streaming = false; // this tab follows its own turn over SSE
  let socketTurn = null; // {turn, own}: the turn the socket's events belong to
  // Turns this tab followed over SSE whose copy on the socket has not started yet: the socket
  // relays the same events, sometimes after the stream has already ended.
  const ownEchoes = [];
  // Turns whose socket copy started before this tab's own stream said turn_start.
  const echoedEarly = [];
  const live = { turn: null, bubble: null, raw: '', log: null, preview: null };
  const seenMessages = new Set(
    [...transcript.querySelectorAll('.message[data-message-id]')].map((m) => m.dataset.messageId),
  );
  const renderSeq = new Map();

  // --- helpers -------------------------------------------------------------------------------

  async function mapReady() {
    const waiting = [map.ready, map.loaded].find((p) => p && typeof p.then === 'function');
    if (waiting) await waiting;
  }

  function request(url, { method = 'GET', body } = {}) {
    const headers = { 'X-CSRFToken': csrfToken(document), Accept: 'application/json' };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    return fetch(url, {
      method,
      headers,
      credentials: 'same-origin',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  }

  function notice(text, { kind = 'error' } = {}) {
    const box = document.createElement('div');
    box.className = `notice ${kind}`;
    box.setAttribute('role', kind === 'error' ? 'alert' : 'status');
    box.dataset.testid = 'notice';
    const message = document.createElement('p');
    message.textContent = text;
    const dismiss = document.createElement('button');
    dismiss.type = 'button';
    dismiss.className = 'link-button';
    dismiss.textContent = 'Dismiss';
    dismiss.setAttribute('aria-label', 'Dismiss this notice');
    dismiss.addEventListener('click', () => box.remove());
    box.append(message, dismiss);
    notices.append(box);
    return box;
  }

  async function errorText(response) {
    try {
      const body = await response.json();
      if (body && typeof body.error === 'string') return body.error;
    } catch {
      /* not JSON: fall through to the status */
    }
    return `the server answered ${response.status}`;
  }

  function setBusy(value) {
    panel.dataset.busy = value ? 'true' : 'false';
    sendButton.disabled = value;
    transcript.setAttribute('aria-busy', value ? 'true' : 'false');
  }

  function applyState(response) {
    const balance = response.headers.get('X-GeoSense-Credits');
    if (balance !== null && credits) credits.textContent = balance;
    const allow = response.headers.get('X-GeoSense-Allow-Backend-Tools');
    if (allow !== null && toggle) toggle.checked = allow === 'true';
  }

  // --- rendering from the server ---------------------------------------------------------------

  function turnElement(turn) {
    let element = transcript.querySelector(`.turn[data-turn="${turn}"]`);
    if (!element) {
      transcript.querySelector('.transcript-empty')?.remove();
      element = document.createElement('div');
      element.className = 'turn';
      element.dataset.turn = String(turn);
      transcript.append(element);
    }
    return element;
  }

  /** Swap in the server's rendering of a turn; the live bubble and activity log stay. */
  async function renderTurn(turn) {
    if (!sessionId || turn === null || turn === undefined) return;
    const seq = (renderSeq.get(turn) || 0) + 1;
    renderSeq.set(turn, seq);
    const response = await fetch(`/chat/${sessionId}/turns/${turn}/`, { credentials: 'same-origin' });
    if (!response.ok || renderSeq.get(turn) !== seq) return;
    applyState(response);
    const fresh = fragment(document, await response.text()).firstElementChild;
    const old = turnElement(turn);
    const log = old.querySelector(':scope > .activity-log');
    const bubble = live.turn === turn && live.bubble?.isConnected ? live.bubble : null;
    old.replaceWith(fresh);
    if (log) {
      const firstUser = fresh.querySelector(':scope > .message.user');
      if (firstUser) firstUser.after(log);
      else fresh.prepend(log);
    }
    if (bubble) fresh.append(bubble);
    arrived(fresh);
  }

  async function renderMessage(messageId) {
    if (!sessionId) return;
    const old = transcript.querySelector(`.message[data-message-id="${messageId}"]`);
    const response = await fetch(`/chat/${sessionId}/messages/${messageId}/`, {
      credentials: 'same-origin',
    });
    if (!response.ok || !old?.isConnected) return;
    applyState(response);
    const fresh = fragment(document, await response.text()).firstElementChild;
    old.replaceWith(fresh);
    enhance(fresh);
  }

  /** New messages in `root`: enhance them, and apply the newest highlight that arrived. */
  function arrived(root) {
    let newest = null;
    for (const message of root.querySelectorAll('.message[data-message-id]')) {
      if (seenMessages.has(message.dataset.messageId)) continue;
      seenMessages.add(message.dataset.messageId);
      const blocks = message.querySelectorAll('[data-highlight]');
      if (blocks.length) newest = blocks[blocks.length - 1];
    }
    enhance(root);
    if (newest) applyHighlight(newest);
    transcript.scrollTop = transcript.scrollHeight;
  }

  /** What the server cannot render: a free-text answer form on open question cards. */
  function enhance(root) {
    for (const block of root.querySelectorAll('.markup-block.question:not(.answered)')) {
      if (block.querySelector('.question-free-form')) continue;
      const form = document.createElement('form');
      form.className = 'question-free-form';
      const input = document.createElement('input');
      input.type = 'text';
      input.maxLength = 2000;
      input.className = 'question-free-text';
      input.setAttribute('aria-label', 'Answer in your own words');
      input.placeholder = 'Or answer in your own words';
      const button = document.createElement('button');
      button.type = 'submit';
      button.className = 'secondary-button';
      button.textContent = 'Answer';
      form.append(input, button);
      block.append(form);
    }
  }

  // --- the live turn ---------------------------------------------------------------------------

  function bubble() {
    if (live.bubble?.isConnected) return live.bubble;
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
    turnElement(live.turn).append(article);
    live.bubble = article;
    live.raw = '';
    live.preview = createStreamPreview({
      url: `/chat/${sessionId}/preview/`,
      headers: { 'X-CSRFToken': csrfToken(document) },
      render: (html) => {
        body.innerHTML = html; // the server's rendering, sanitised like every stored message
      },
      fallback: (raw) => {
        text.textContent = previewText(raw);
        body.replaceChildren(text);
      },
    });
    return article;
  }

  function closeBubble() {
    if (live.bubble) live.bubble.removeAttribute('aria-busy');
    live.preview?.close();
    live.preview = null;
    live.bubble = null;
    live.raw = '';
  }

  function activityLog() {
    if (live.log?.isConnected) return live.log;
    const details = document.createElement('details');
    details.className = 'activity-log';
    details.dataset.testid = 'activity-log';
    const summary = document.createElement('summary');
    summary.textContent = 'Activity';
    const list = document.createElement('ol');
    details.append(summary, list);
    const turn = turnElement(live.turn);
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
    const count = details.querySelectorAll('li').length;
    details.querySelector('summary').textContent = `Activity (${count} step${count === 1 ? '' : 's'})`;
  }

  function handleEvent(name, data) {
    switch (name) {
      case 'turn_start':
        if (live.turn !== data.turn) {
          live.turn = data.turn;
          live.log = null;
          closeBubble();
        }
        turnElement(data.turn);
        renderTurn(data.turn);
        break;
      case 'text_delta':
        if (live.turn === null) break;
        bubble();
        live.raw += data.delta || '';
        live.preview.update(live.raw);
        break;
      case 'backend_thinking':
        if (live.turn === null) break;
        closeBubble();
        logEntry('thinking', (item) => {
          item.textContent = data.text || '';
        });
        break;
      case 'backend_tool_call':
        if (live.turn === null) break;
        closeBubble();
        logEntry('call', (item) => {
          item.dataset.ok = data.ok ? 'true' : 'false';
          const tool = document.createElement('code');
          tool.textContent = data.name;
          const outcome = document.createElement('span');
          outcome.className = 'activity-outcome';
          outcome.textContent = data.ok ? ' ok' : ` failed${data.error ? `: ${data.error}` : ''}`;
          item.append(tool, outcome);
        });
        break;
      case 'client_tool_call':
        closeBubble();
        if (data.kind === 'one-way') mapReady().then(() => tools.applyOneWay(data.name, data.arguments || {}));
        break;
      case 'message':
        closeBubble();
        live.bubble?.remove();
        if (data.turn !== undefined) live.turn = data.turn;
        transcript.querySelectorAll('.message.streaming').forEach((m) => m.remove());
        renderTurn(live.turn);
        break;
      case 'error':
        notice(`The assistant ran into a problem: ${data.message || 'unknown error'}`);
        break;
      case 'turn_end':
        closeBubble();
        transcript.querySelectorAll('.message.streaming').forEach((m) => m.remove());
        renderTurn(live.turn);
        if (panel.dataset.sessionTitle === '') onTitleMaybeChanged(sessionId);
        break;
      default:
        break;
    }
  }

  /**
   * Follow a turn this tab starts over SSE. Resolves true when the turn started, false when
   * the server refused it (then `onRefused` runs, e.g. to give the user their text back).
   */
  function stream(url, payload, { onRefused = () => {} } = {}) {
    return new Promise((resolve) => {
      streaming = true;
      setBusy(true);
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
        streaming = false;
        setBusy(false);
        source.close();
        resolve(started);
      };
      for (const name of TURN_EVENTS) {
        source.addEventListener(name, (event) => {
          if (name === 'error' && 'responseCode' in event) return; // the transport, below
          let data = {};
          try {
            data = JSON.parse(event.data || '{}');
          } catch {
            return;
          }
          if (name === 'turn_start') {
            started = true;
            const early = echoedEarly.indexOf(data.turn);
            if (early !== -1) echoedEarly.splice(early, 1);
            else ownEchoes.push(data.turn);
          }
          handleEvent(name, data);
          if (name === 'turn_end') finish();
        });
      }
      source.addEventListener('error', (event) => {
        if (!('responseCode' in event) || ended) return;
        if (event.responseCode >= 400) {
          let text = `the server answered ${event.responseCode}`;
          try {
            text = JSON.parse(event.data).error || text;
          } catch {
            /* keep the status */
          }
          notice(`Not sent: ${text}.`);
          onRefused();
        } else if (started) {
          notice('The connection was lost while the answer was written; it continues on the server.');
          if (socketTurn) socketTurn.own = false; // the socket's events take over
        } else {
          notice('The server could not be reached. Your message was not sent.');
          onRefused();
        }
        finish();
      });
      source.addEventListener('readystatechange', (event) => {
        if (event.readyState === SSE.CLOSED && !ended) {
          if (started) renderTurn(live.turn);
          finish();
        }
      });
      source.stream();
    });
  }

  async function ensureSession() {
    if (sessionId) return sessionId;
    const response = await request('/api/sessions', { method: 'POST', body: {} });
    if (!response.ok) throw new Error(await errorText(response));
    sessionId = (await response.json()).id;
    panel.dataset.sessionId = sessionId;
    if (toggle) toggle.disabled = false;
    history.replaceState(null, '', `/chat/${sessionId}/`);
    onSessionCreated(sessionId);
    return sessionId;
  }

  /** Send a user message (with data contexts); resolves true once its turn started. */
  async function send(text, { contexts = [], onRefused = () => {} } = {}) {
    if (streaming) {
      notice('Wait until the current answer is finished.');
      onRefused();
      return false;
    }
    try {
      await ensureSession();
    } catch (error) {
      notice(`Could not start a conversation: ${error.message}`);
      onRefused();
      return false;
    }
    const payload = contexts.length ? { text, contexts } : { text };
    return stream(`/api/sessions/${sessionId}/message/stream`, payload, { onRefused });
  }

  function resume(payload, { onRefused }) {
    return stream(`/api/sessions/${sessionId}/message/resume/stream`, payload, { onRefused });
  }

  // --- actions ---------------------------------------------------------------------------------

  function applyHighlight(block) {
    let data;
    try {
      data = JSON.parse(block.dataset.highlight);
    } catch {
      return;
    }
    mapReady().then(() => map.highlight(data));
  }

  async function answerQuestion(block, { optionIndex = null, message, contextTypes = [] }) {
    if (block.dataset.busy === 'true') return;
    block.dataset.busy = 'true';
    const controls = block.querySelectorAll('button, input');
    controls.forEach((c) => {
      c.disabled = true;
    });
    const reset = () => {
      block.dataset.busy = 'false';
      controls.forEach((c) => {
        c.disabled = false;
      });
    };
    let contexts = [];
    if (contextTypes.length) {
      try {
        await mapReady();
        contexts = await map.contexts(contextTypes);
      } catch (error) {
        notice(`The map could not give the requested context: ${error.message || error}`);
        reset();
        return;
      }
    }
    const text = composeAnswer(block.dataset.questionId, optionIndex, message);
    const started = await send(text, { contexts, onRefused: reset });
    const holder = block.closest('.message[data-message-id]');
    if (started && holder) renderMessage(holder.dataset.messageId);
  }

  async function runFindSimilar(block, button) {
    if (block.dataset.busy === 'true') return;
    let data;
    try {
      data = JSON.parse(block.dataset.findSimilar);
    } catch {
      return;
    }
    block.dataset.busy = 'true';
    button.disabled = true;
    const reset = () => {
      block.dataset.busy = 'false';
      button.disabled = false;
    };
    try {
      await ensureSession();
    } catch (error) {
      notice(`Could not run the search: ${error.message}`);
      reset();
      return;
    }
    const body = { samples: data.samples || [] };
    if (data.hint) body.hint = data.hint;
    const response = await request(`/api/sessions/${sessionId}/find-similar`, {
      method: 'POST',
      body,
    });
    if (!response.ok) {
      notice(`The similarity search failed: ${await errorText(response)}`);
      reset();
      return;
    }
    const found = await response.json();
    const className = found.class || data.hint || 'annotation';
    await mapReady();
    map.highlight({ ids: found.ids });
    const requestId = block.dataset.requestId;
    const text = composeResponse(className, requestId, found.ids.length);
    const contexts = [
      { type: 'selection', data: { ids: found.ids, class: className, request: requestId } },
    ];
    const started = await send(text, { contexts, onRefused: reset });
    const holder = block.closest('.message[data-message-id]');
    if (started && holder) renderMessage(holder.dataset.messageId);
  }

  async function decideApproval(card, decision) {
    if (card.dataset.busy === 'true') return;
    card.dataset.busy = 'true';
    card.setAttribute('aria-busy', 'true');
    card.querySelectorAll('.approval-decide').forEach((b) => {
      b.disabled = true;
    });
    const holder = card.closest('.message[data-message-id]');
    await resume(
      { approval: Number(card.dataset.approvalId), decision },
      { onRefused: () => holder && renderMessage(holder.dataset.messageId) },
    );
  }

  async function pickOnMap(card, button) {
    if (card.dataset.busy === 'true') return;
    const tool = tools.find((t) => t.declaration.name === 'map_select');
    if (!tool) return;
    card.dataset.busy = 'true';
    button.disabled = true;
    await mapReady();
    const result = await tool.answer({
      prompt: card.dataset.prompt || undefined,
      class: card.dataset.class || undefined,
    });
    const holder = card.closest('.message[data-message-id]');
    await resume(
      { tool_call: card.dataset.toolCall, result },
      {
        onRefused: () => {
          card.dataset.busy = 'false';
          button.disabled = false;
          if (holder) renderMessage(holder.dataset.messageId);
        },
      },
    );
  }

  transcript.addEventListener('click', (event) => {
    const target = event.target.closest('button');
    if (!target || target.disabled) return;
    const option = target.closest('.question-option');
    if (option) {
      answerQuestion(option.closest('.markup-block.question'), {
        optionIndex: Number(option.dataset.optionIndex),
        message: option.dataset.message || option.textContent,
        contextTypes: (option.dataset.context || '').split(/\s+/).filter(Boolean),
      });
      option.setAttribute('aria-pressed', 'true');
      return;
    }
    if (target.classList.contains('approval-decide')) {
      decideApproval(target.closest('.approval-card'), target.dataset.decision);
    } else if (target.classList.contains('decision-pick')) {
      pickOnMap(target.closest('.decision-card'), target);
    } else if (target.classList.contains('highlight-apply')) {
      applyHighlight(target.closest('[data-highlight]'));
    } else if (target.classList.contains('find-similar-run')) {
      runFindSimilar(target.closest('[data-find-similar]'), target);
    } else if (target.classList.contains('chip') && target.dataset.annotationId) {
      const id = Number(target.dataset.annotationId);
      if (Number.isInteger(id)) mapReady().then(() => map.focus([id]));
    }
  });

  transcript.addEventListener('submit', (event) => {
    const form = event.target.closest('.question-free-form');
    if (!form) return;
    event.preventDefault();
    const input = form.querySelector('input');
    const message = input.value.trim();
    if (!message) return;
    answerQuestion(form.closest('.markup-block.question'), { message });
  });

  composer.addEventListener('submit', async (event) => {
    event.preventDefault();
    const text = textarea.value;
    if (!text.trim()) return;
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

  toggle?.addEventListener('change', async () => {
    const wanted = toggle.checked;
    try {
      await ensureSession();
      const response = await request(`/api/sessions/${sessionId}`, {
        method: 'PATCH',
        body: { allow_backend_tools: wanted },
      });
      if (!response.ok) throw new Error(await errorText(response));
      toggle.checked = (await response.json()).allow_backend_tools;
    } catch (error) {
      toggle.checked = !wanted;
      notice(`The setting was not changed: ${error.message}`);
    }
  });

  enhance(transcript);
  transcript.scrollTop = transcript.scrollHeight;

  return {
    get session() {
      return sessionId;
    },
    /** A live event of the bound session from the socket; other tabs' turns are shown here. */
    onSocketEvent(name, data) {
      if (name === 'turn_start') {
        // Echoes that never came (the socket was away during that stream) are older turns.
        while (ownEchoes.length && ownEchoes[0] < data.turn) ownEchoes.shift();
        let own = ownEchoes[0] === data.turn;
        if (own) ownEchoes.shift();
        else if (streaming) {
          // The socket's copy overtook this tab's own stream: skip it, and its echo later.
          own = true;
          echoedEarly.push(data.turn);
        }
        socketTurn = { turn: data.turn, own };
      }
      // Bound in the middle of a turn (no turn_start seen): it is this tab's if it streams one.
      const own = socketTurn ? socketTurn.own : streaming || ownEchoes.length > 0;
      if (name === 'turn_end') {
        if (!socketTurn) ownEchoes.length = 0;
        socketTurn = null;
      }
      if (!own) handleEvent(name, data);
    },
    /**
     * After a (re)bind: show what was stored while this tab was not listening (a reload or a
     * lost socket mid-turn), by rendering the latest turns again from the server.
     */
    async catchUp() {
      if (!sessionId || streaming) return;
      const response = await fetch(`/api/sessions/${sessionId}`, { credentials: 'same-origin' });
      if (!response.ok) return;
      const turns = new Set((await response.json()).messages.map((m) => m.turn));
      const shown = [...transcript.querySelectorAll('.turn[data-turn]')].map((t) => Number(t.dataset.turn));
      const latestShown = shown.length ? Math.max(...shown) : -1;
      for (const turn of [...turns].sort((a, b) => a - b)) {
        if (turn >= latestShown) await renderTurn(turn);
      }
    },
    notice,
    send,
  };
}
