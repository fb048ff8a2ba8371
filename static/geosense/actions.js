// What the reader does in the transcript: answer a question, run a find-similar search,
// decide an approval, pick annotations for a reader-answered client tool, show a highlight or
// focus a chip. Each card is busy while its action runs and comes back usable if refused.

import { composeAnswer, composeResponse } from './compose.js';
import { errorText, request } from './http.js';

/**
 * What the actions need of the chat.
 *
 * @typedef {{
 *   element: HTMLElement,   the #transcript
 *   map: object,            window.geosenseMap (map.js)
 *   mapReady: () => Promise<void>,
 *   tools: Array<{declaration: object, answer?: (args: object) => Promise<object>}>,
 *   notice: (text: string) => void,
 *   session: () => string | null,
 *   ensureSession: () => Promise<string>,
 *   send: (text: string, options: {contexts?: object[], onRefused?: () => void}) => Promise<boolean>,
 *   resume: (payload: object, options: {onRefused: () => void}) => Promise<boolean>,
 *   renderMessage: (messageId: string) => Promise<void>,
 *   document?: Document,
 * }} Chat
 */

/** Disable a card's controls while its action runs; the returned function gives them back. */
function busy(card, controls) {
  card.dataset.busy = 'true';
  controls.forEach((control) => {
    control.disabled = true;
  });
  return () => {
    card.dataset.busy = 'false';
    controls.forEach((control) => {
      control.disabled = false;
    });
  };
}

/** Show the message that holds `card` as the server renders it now (answered, decided). */
function rerender(chat, card) {
  const holder = card.closest('.message[data-message-id]');
  if (holder) chat.renderMessage(holder.dataset.messageId);
}

/** @param {Chat} chat */
export function applyHighlight(chat, block) {
  let data;
  try {
    data = JSON.parse(block.dataset.highlight);
  } catch {
    return;
  }
  chat.mapReady().then(() => {
    chat.map.highlight(data);
    // For the layout (layout.js): a phone showing the chat marks its Map switch.
    block.dispatchEvent(new CustomEvent('geosense:highlight-shown', { bubbles: true }));
  });
}

/** @param {Chat} chat */
async function answerQuestion(chat, block, { optionIndex = null, message, contextTypes = [] }) {
  if (block.dataset.busy === 'true') return;
  const reset = busy(block, block.querySelectorAll('button, input'));
  let contexts = [];
  if (contextTypes.length) {
    try {
      await chat.mapReady();
      contexts = await chat.map.contexts(contextTypes);
    } catch (error) {
      chat.notice(`The map could not give the requested context: ${error.message || error}`);
      reset();
      return;
    }
  }
  const text = composeAnswer(block.dataset.questionId, optionIndex, message, block.dataset.messageId);
  if (await chat.send(text, { contexts, onRefused: reset })) rerender(chat, block);
}

/** @param {Chat} chat */
async function runFindSimilar(chat, block, button) {
  if (block.dataset.busy === 'true') return;
  let data;
  try {
    data = JSON.parse(block.dataset.findSimilar);
  } catch {
    return;
  }
  const reset = busy(block, [button]);
  try {
    await chat.ensureSession();
  } catch (error) {
    chat.notice(`Could not run the search: ${error.message}`);
    reset();
    return;
  }
  // A hint alone searches its class (the server renders a block whose search cannot run as
  // an invalid chip, without this button).
  const body = {};
  if (data.samples?.length) body.samples = data.samples;
  if (data.hint) body.hint = data.hint;
  const response = await request(`/api/sessions/${chat.session()}/find-similar`, {
    method: 'POST',
    body,
    document: chat.document,
  });
  if (!response.ok) {
    chat.notice(`The similarity search failed: ${await errorText(response)}`);
    reset();
    return;
  }
  const found = await response.json();
  const className = found.class || data.hint || 'annotation';
  await chat.mapReady();
  chat.map.highlight({ ids: found.ids });
  const requestId = block.dataset.requestId;
  const contexts = [
    { type: 'selection', data: { ids: found.ids, class: className, request: requestId } },
  ];
  const text = composeResponse(className, requestId, found.ids.length);
  if (await chat.send(text, { contexts, onRefused: reset })) rerender(chat, block);
}

/** @param {Chat} chat */
async function decideApproval(chat, card, decision) {
  if (card.dataset.busy === 'true') return;
  busy(card, card.querySelectorAll('.approval-decide'));
  card.setAttribute('aria-busy', 'true');
  await chat.resume(
    { approval: Number(card.dataset.approvalId), decision },
    { onRefused: () => rerender(chat, card) },
  );
}

/** @param {Chat} chat */
async function pickOnMap(chat, card, button) {
  if (card.dataset.busy === 'true') return;
  const tool = chat.tools.find((t) => t.declaration.name === 'map_select');
  if (!tool) return;
  const reset = busy(card, [button]);
  await chat.mapReady();
  const result = await tool.answer({
    prompt: card.dataset.prompt || undefined,
    class: card.dataset.class || undefined,
  });
  await chat.resume(
    { tool_call: card.dataset.toolCall, result },
    {
      onRefused: () => {
        reset();
        rerender(chat, card);
      },
    },
  );
}

/** One click in the transcript, routed to its action by the button's class. */
function clicked(chat, target) {
  const option = target.closest('.question-option');
  if (option) {
    answerQuestion(chat, option.closest('.markup-block.question'), {
      optionIndex: Number(option.dataset.optionIndex),
      message: option.dataset.message || option.textContent,
      contextTypes: (option.dataset.context || '').split(/\s+/).filter(Boolean),
    });
    option.setAttribute('aria-pressed', 'true');
  } else if (target.classList.contains('approval-decide')) {
    decideApproval(chat, target.closest('.approval-card'), target.dataset.decision);
  } else if (target.classList.contains('decision-pick')) {
    pickOnMap(chat, target.closest('.decision-card'), target);
  } else if (target.classList.contains('highlight-apply')) {
    applyHighlight(chat, target.closest('[data-highlight]'));
  } else if (target.classList.contains('find-similar-run')) {
    runFindSimilar(chat, target.closest('[data-find-similar]'), target);
  } else if (target.classList.contains('chip') && target.dataset.annotationId) {
    const id = Number(target.dataset.annotationId);
    if (Number.isInteger(id)) chat.mapReady().then(() => chat.map.focus([id]));
  }
}

/**
 * Route the transcript's clicks and the free-text answers to their actions.
 *
 * @param {Chat} chat
 */
export function wireTranscriptActions(chat) {
  chat.element.addEventListener('click', (event) => {
    const target = event.target.closest('button');
    if (target && !target.disabled) clicked(chat, target);
  });
  // The free-text answer form is rendered by the server on every open question.
  chat.element.addEventListener('submit', (event) => {
    const form = event.target.closest('.question-free-form');
    if (!form) return;
    event.preventDefault();
    const message = form.querySelector('input').value.trim();
    if (message) answerQuestion(chat, form.closest('.markup-block.question'), { message });
  });
}
