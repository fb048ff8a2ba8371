// The transcript as the server renders it. Every stored message is shown in the server's
// HTML (templates/chat/turn.html, message.html), the same on first load, after a live turn
// and after a reload; this module fetches a turn or a message again and swaps it in, keeping
// what the page built live: the activity log and a location card still being answered.
// The page opens with the latest turns; the marker above them (`.transcript-earlier`) loads
// the page of turns before when it scrolls into view (or its button is pressed), keeping the
// reader's place.

import { mergeStoredLog } from './activity-log.js';
import { fetchFragment } from './http.js';

// The page's own location card (location-card.js) while it is on screen.
const LIVE_CARD = '.location-card[data-live="true"]';

/**
 * The page's location card is asked for on the socket, which can be ahead of the turn's
 * stream: a card asked before its turn's element exists waits at the end of the transcript
 * (or of the turn before), and the reader may answer it there. The turn claims the cards no
 * turn has claimed yet when it starts and when it ends, moving them into its element `home`,
 * so every render of the turn finds its card, whatever the reader answered meanwhile.
 */
function claimCards(transcript, home, turn) {
  for (const card of transcript.querySelectorAll(`${LIVE_CARD}:not([data-turn])`)) {
    card.dataset.turn = String(turn);
    if (!home.contains(card)) home.append(card);
  }
}

/** The live card a render of `turn` keeps: its own, or (the latest turn) one not claimed yet. */
function liveCardOf(transcript, turn, latest) {
  return (
    transcript.querySelector(`${LIVE_CARD}[data-turn="${turn}"]`) ||
    (latest ? transcript.querySelector(`${LIVE_CARD}:not([data-turn])`) : null)
  );
}

/** `fresh` replaces `old`; a later turn's card put in `old` before its turn existed stays. */
function swapTurn(old, fresh, liveCard) {
  const others = [...old.querySelectorAll(LIVE_CARD)].filter((card) => card !== liveCard);
  old.replaceWith(fresh);
  fresh.after(...others);
}

/** The live log stays, with the stored entries (which know the outcomes) merged in. */
function keepLog(fresh, log) {
  const stored = fresh.querySelector(':scope > .activity-log');
  if (stored) {
    mergeStoredLog(log, stored);
    stored.replaceWith(log);
    return;
  }
  const firstUser = fresh.querySelector(':scope > .message.user');
  if (firstUser) firstUser.after(log);
  else fresh.prepend(log);
}

/**
 * The page's own location card, live while its request runs, takes the place of the
 * server's card of a call still waiting for it (where the call was made); a server card in
 * its final state replaces it, wherever on the page the live card was.
 */
function keepLocationCard(fresh, liveCard) {
  const stored = fresh.querySelector('.location-card');
  if (!stored) fresh.append(liveCard);
  else if (stored.dataset.status === 'waiting') stored.replaceWith(liveCard);
  else liveCard.remove();
}

/**
 * Where the page's new location card goes in `home` (the running turn): in the place of the
 * server's card of a call still waiting for it there, when the turn's render landed before
 * the socket's call (`keepLocationCard` is the other order), else at the end.
 */
export function placeLiveCard(home, card) {
  const waiting = home.querySelectorAll('.location-card[data-status="waiting"]:not([data-live])');
  if (waiting.length) waiting[waiting.length - 1].replaceWith(card);
  else home.append(card);
}

/**
 * @param {{
 *   element: HTMLElement,                  the #transcript
 *   session: () => string | null,          the open chat session
 *   onState: (response: Response) => void, what a fragment's headers say changed
 *   onHighlight: (block: HTMLElement) => void, the newest highlight block that arrived
 *   keep: (turn: number) => HTMLElement | null, an element to carry into a re-rendered turn
 *   document?: Document,
 * }} options
 */
export function createTranscript({ element, session, onState, onHighlight, keep, document = globalThis.document }) {
  const seen = new Set(
    [...element.querySelectorAll('.message[data-message-id]')].map((m) => m.dataset.messageId),
  );
  const renders = new Map(); // turn → the number of its latest render, so only the last lands

  /** The element of a turn, created (at the end) when the page has none yet. */
  function turnElement(turn) {
    let found = element.querySelector(`.turn[data-turn="${turn}"]`);
    if (!found) {
      element.querySelector('.transcript-empty')?.remove();
      found = document.createElement('div');
      found.className = 'turn';
      found.dataset.turn = String(turn);
      element.append(found);
    }
    return found;
  }

  /** Swap in the server's rendering of a turn; its activity log and `keep(turn)` stay. */
  async function renderTurn(turn) {
    const id = session();
    if (!id || turn === null || turn === undefined) return;
    const render = (renders.get(turn) || 0) + 1;
    renders.set(turn, render);
    const { response, element: fresh } = await fetchFragment(`/chat/${id}/turns/${turn}/`, { document });
    if (!fresh || renders.get(turn) !== render) return;
    onState(response);
    const old = turnElement(turn);
    const log = old.querySelector(':scope > .activity-log');
    const kept = keep(turn);
    const liveCard = liveCardOf(element, turn, isLatest(turn));
    swapTurn(old, fresh, liveCard);
    if (log) keepLog(fresh, log);
    if (liveCard) keepLocationCard(fresh, liveCard);
    if (kept) fresh.append(kept);
    arrived(fresh);
  }

  function claimLiveCards(turn) {
    if (turn !== null && turn !== undefined) claimCards(element, turnElement(turn), turn);
  }

  function isLatest(turn) {
    return shownTurns().every((shown) => shown <= turn);
  }

  /** Swap in the server's rendering of one message (a card after its decision). */
  async function renderMessage(messageId) {
    const id = session();
    if (!id) return;
    const old = element.querySelector(`.message[data-message-id="${messageId}"]`);
    const { response, element: fresh } = await fetchFragment(`/chat/${id}/messages/${messageId}/`, { document });
    if (!fresh || !old?.isConnected) return;
    onState(response);
    old.replaceWith(fresh);
  }

  /**
   * Cards still waiting in turns other than `turn` (a new turn started: an approval or a
   * decision there was set aside) are shown again as the server has them now.
   */
  function settleCards(turn) {
    const waiting = element.querySelectorAll(
      '.approval-card[data-status="pending"], .decision-card[data-status="pending"]',
    );
    for (const card of waiting) {
      const holder = card.closest('.message[data-message-id]');
      if (holder && Number(holder.dataset.turn) !== turn) renderMessage(holder.dataset.messageId);
    }
  }

  /** New messages in `root`: the newest highlight among them is applied to the map. */
  function arrived(root) {
    let newest = null;
    for (const message of root.querySelectorAll('.message[data-message-id]')) {
      if (seen.has(message.dataset.messageId)) continue;
      seen.add(message.dataset.messageId);
      const blocks = message.querySelectorAll('[data-highlight]');
      if (blocks.length) newest = blocks[blocks.length - 1];
    }
    if (newest) onHighlight(newest);
    scrollToEnd();
  }

  function scrollToEnd() {
    element.scrollTop = element.scrollHeight;
  }

  /** Load the page of turns before `marker`'s turn in its place, keeping the reader's place. */
  async function loadEarlier(marker) {
    const id = session();
    if (!id || marker.dataset.loading === 'true') return;
    marker.dataset.loading = 'true';
    let response;
    try {
      response = await fetch(`/chat/${id}/turns/?before=${encodeURIComponent(marker.dataset.before)}`, {
        credentials: 'same-origin',
      });
    } catch {
      response = null;
    }
    if (!response?.ok || !marker.isConnected || session() !== id) {
      marker.dataset.loading = 'false';
      return;
    }
    const template = document.createElement('template');
    template.innerHTML = await response.text();
    if (!marker.isConnected) return;
    const fromBottom = element.scrollHeight - element.scrollTop;
    for (const message of template.content.querySelectorAll('.message[data-message-id]')) {
      seen.add(message.dataset.messageId); // older turns never move the map
    }
    marker.replaceWith(template.content);
    element.scrollTop = element.scrollHeight - fromBottom;
    watchEarlier();
  }

  const observer =
    typeof IntersectionObserver === 'function'
      ? new IntersectionObserver(
          (entries) => {
            for (const entry of entries) if (entry.isIntersecting) loadEarlier(entry.target);
          },
          { root: element, rootMargin: '200px 0px 0px 0px' },
        )
      : null;

  /** Watch the marker of earlier turns, if the transcript has one. */
  function watchEarlier() {
    const marker = element.querySelector(':scope > .transcript-earlier');
    if (marker && observer) observer.observe(marker);
  }

  element.addEventListener('click', (event) => {
    const button = event.target.closest?.('.transcript-earlier-button');
    if (button) loadEarlier(button.closest('.transcript-earlier'));
  });
  watchEarlier();

  /** The turn numbers on the page. */
  function shownTurns() {
    return [...element.querySelectorAll('.turn[data-turn]')].map((t) => Number(t.dataset.turn));
  }

  return { element, turnElement, claimLiveCards, renderTurn, renderMessage, settleCards, scrollToEnd, shownTurns };
}
