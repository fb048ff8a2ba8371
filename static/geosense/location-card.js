// GeoSense's own location card: asked before the browser's prompt, because a permission the
// user blocks in the browser is hard to undo. It answers once; a second press does nothing.
// When its request is settled without the user (the turn ended, the reader switched
// conversation), it shows what the model read, PENDING, with its buttons disabled; the
// server's card of the call (templates/chat/location_card.html) says the same words.

const OUTCOME_TEXT = Object.freeze({
  DECLINED: 'Location not shared.',
  UNAVAILABLE: 'Location unavailable.',
});
export const SETTLED_TEXT = 'Answered: PENDING, no answer yet.';

let cardCount = 0;

function outcomeText(result) {
  if (result.status === 'GRANTED') {
    return `Location shared (within about ${Math.round(result.accuracy)} m).`;
  }
  return OUTCOME_TEXT[result.status] ?? 'Location not shared.';
}

function element(document, tag, { text, testid, className } = {}) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (testid) node.setAttribute('data-testid', testid);
  if (className) node.className = className;
  return node;
}

/**
 * Returns an `askPermission` for createLocationService: each call gives a card to `place`
 * (which puts it in the chat transcript) and returns `{answer, close(result)}`. `answer` resolves
 * once, with 'allow' or 'deny'; the buttons are removed at the first press. `close(result)`
 * shows the request's outcome in the card, which stays in the transcript as a record.
 * `settle()` ends the card without the user: `answer` resolves 'dismiss' (if it has not
 * resolved yet), the buttons are disabled, the card says PENDING and ignores a later `close`.
 *
 * @param {{place: (card: HTMLElement) => void, document?: Document}} options
 * @returns {() => {answer: Promise<'allow' | 'deny' | 'dismiss'>,
 *                  close(result: {status: string}): void, settle(): void}}
 */
export function createLocationCard({ place, document = globalThis.document }) {
  return function askPermission() {
    cardCount += 1;
    const headingId = `location-card-heading-${cardCount}`;

    const card = element(document, 'section', { testid: 'location-card', className: 'card location-card' });
    card.setAttribute('data-live', 'true');
    card.setAttribute('data-status', 'asking');
    card.setAttribute('role', 'region');
    card.setAttribute('aria-labelledby', headingId);
    const heading = element(document, 'h3', { text: 'Share your location?', className: 'card-title' });
    heading.setAttribute('id', headingId);
    const text = element(document, 'p', {
      text: 'The assistant would like to use your location to answer your question.',
    });
    const actions = element(document, 'div', { className: 'card-actions location-card-actions' });
    const allow = element(document, 'button', { text: 'Allow', testid: 'location-allow', className: 'primary-button' });
    const deny = element(document, 'button', { text: 'Not now', testid: 'location-deny', className: 'secondary-button' });
    const status = element(document, 'p', { testid: 'location-status', className: 'location-card-status' });
    status.setAttribute('role', 'status');
    status.setAttribute('aria-live', 'polite');
    for (const button of [allow, deny]) {
      button.setAttribute('type', 'button');
      actions.appendChild(button);
    }
    for (const part of [heading, text, actions, status]) card.appendChild(part);

    let answered = false;
    let settled = false;
    let dismiss = () => {};
    const answer = new Promise((resolve) => {
      const press = (choice, waitingText) => () => {
        if (answered) return;
        answered = true;
        allow.disabled = true;
        deny.disabled = true;
        actions.remove();
        status.textContent = waitingText;
        card.setAttribute('data-status', choice === 'allow' ? 'locating' : 'DECLINED');
        resolve(choice);
      };
      allow.addEventListener('click', press('allow', 'Waiting for your browser…'));
      deny.addEventListener('click', press('deny', 'Location not shared.'));
      dismiss = () => resolve('dismiss');
    });

    place(card);
    return {
      answer,
      close(result) {
        if (settled) return;
        card.setAttribute('data-status', result.status);
        status.textContent = outcomeText(result);
      },
      settle() {
        if (settled) return;
        settled = true;
        answered = true;
        allow.disabled = true;
        deny.disabled = true;
        card.setAttribute('data-status', 'PENDING');
        status.textContent = SETTLED_TEXT;
        dismiss();
      },
    };
  };
}
