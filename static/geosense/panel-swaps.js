// The chat panel is swapped by htmx (a conversation in the list, "New conversation"); the reader
// may send in the panel on screen while the other one is still loading. Whatever the reader did
// last wins: a panel asked for before the reader's latest send is not swapped in, because the
// swap would take away the panel that is sending, and its message and answer would go on in a
// detached panel, seen nowhere (the box emptied, nothing in the transcript: issue 16's CI flake,
// tests/browser/test_chat_switch_race.py).

/**
 * @param {{body: EventTarget, panelId?: string}} options  `body`: where htmx's events bubble to
 * @returns {{acted(): void}}  call `acted()` when the reader sends (or resumes) in the panel
 */
export function guardPanelSwaps({ body, panelId = 'chat-panel' }) {
  let acts = 0;
  const asked = new WeakMap(); // request (its XMLHttpRequest) → acts when it was made
  const forPanel = (event) => event.detail?.target?.id === panelId && event.detail.xhr;

  body.addEventListener('htmx:beforeRequest', (event) => {
    if (forPanel(event)) asked.set(event.detail.xhr, acts);
  });
  body.addEventListener('htmx:beforeSwap', (event) => {
    if (!forPanel(event) || !asked.has(event.detail.xhr)) return;
    if (asked.get(event.detail.xhr) !== acts) event.detail.shouldSwap = false;
  });
  return {
    acted() {
      acts += 1;
    },
  };
}
