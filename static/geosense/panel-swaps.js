// The chat panel is swapped by htmx (a conversation in the list, "New conversation"); the reader
// may go on in the panel on screen while the other one is still loading:
// - a send (or resume) there: whatever the reader did last wins, so a panel asked for before
//   the reader's latest send is not swapped in. The swap would take away the panel that is
//   sending, and its message and answer would go on in a detached panel, seen nowhere (the box
//   emptied, nothing in the transcript: issue 16's CI flake, tests/browser/test_chat_switch_race.py);
// - typing there: the text typed while the panel loaded is the reader's next message, for the
//   panel they asked for: it is carried into the new panel's box (`takeDraft`), not lost with
//   the old one.

/**
 * @param {{body: EventTarget, panelId?: string, draft?: () => string}} options
 *   `body`: where htmx's events bubble to; `draft`: the text in the panel's box now
 * @returns {{acted(): void, takeDraft(): string}}  `acted()`: the reader sends (or resumes) in
 *   the panel; `takeDraft()`: the text typed while the panel now shown was loading ('' if none)
 */
export function guardPanelSwaps({ body, panelId = 'chat-panel', draft = () => '' }) {
  let acts = 0;
  let carried = '';
  const asked = new WeakMap(); // request (its XMLHttpRequest) → {acts, draft} when it was made
  const forPanel = (event) => event.detail?.target?.id === panelId && event.detail.xhr;

  body.addEventListener('htmx:beforeRequest', (event) => {
    if (forPanel(event)) asked.set(event.detail.xhr, { acts, draft: draft() });
  });
  body.addEventListener('htmx:beforeSwap', (event) => {
    const request = forPanel(event) && asked.get(event.detail.xhr);
    if (!request) return;
    if (request.acts !== acts) {
      event.detail.shouldSwap = false;
      return;
    }
    const now = draft();
    carried = now !== request.draft ? now : '';
  });
  return {
    acted() {
      acts += 1;
    },
    takeDraft() {
      const text = carried;
      carried = '';
      return text;
    },
  };
}
