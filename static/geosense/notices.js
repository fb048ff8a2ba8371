// Notices above the composer: errors and statuses, text only, never more than MAX_NOTICES.
//
// Which stay and which fade: an error stays until the user dismisses it (it says something went
// wrong with what they did: a message not sent, a search that failed), unless it is also kept
// elsewhere (`fade: true`: a turn's error, which the transcript records as a note). A status
// (a passing state: "wait until the answer is finished") fades after STATUS_MS, counted again
// once the reader's pointer or focus leaves it. A new notice beyond the third pushes the oldest
// out; the same text again brings its notice to the front instead of stacking a copy.

export const MAX_NOTICES = 3;
export const STATUS_MS = 6000;
export const FADING_ERROR_MS = 12000;
const FADE_OUT_MS = 400;

/**
 * @param {{
 *   container: HTMLElement,
 *   document?: Document,
 *   setTimeout?: typeof setTimeout,
 *   clearTimeout?: typeof clearTimeout,
 * }} options
 * @returns {(text: string, options?: {kind?: 'error' | 'status', fade?: boolean}) => HTMLElement}
 *   show a notice
 */
export function createNotices({
  container,
  document = globalThis.document,
  setTimeout: later = (fn, ms) => globalThis.setTimeout(fn, ms),
  clearTimeout: cancelLater = (id) => globalThis.clearTimeout(id),
}) {
  const timers = new WeakMap();

  function remove(box) {
    cancelLater(timers.get(box));
    box.remove();
  }

  function fadeOut(box) {
    box.dataset.fading = 'true';
    timers.set(box, later(() => box.remove(), FADE_OUT_MS));
  }

  return function notice(text, { kind = 'error', fade = kind === 'status' } = {}) {
    const shown = [...container.querySelectorAll(':scope > .notice')];
    const same = shown.find((box) => box.dataset.text === text && box.dataset.fading !== 'true');
    if (same) remove(same);
    else {
      const live = shown.filter((box) => box.dataset.fading !== 'true');
      for (const box of live.slice(0, Math.max(0, live.length - MAX_NOTICES + 1))) remove(box);
    }
    const box = document.createElement('div');
    box.className = `notice ${kind}`;
    box.setAttribute('role', kind === 'error' ? 'alert' : 'status');
    box.dataset.testid = 'notice';
    box.dataset.text = text;
    box.dataset.stays = fade ? 'false' : 'true';
    const message = document.createElement('p');
    message.textContent = text;
    const dismiss = document.createElement('button');
    dismiss.type = 'button';
    dismiss.className = 'link-button';
    dismiss.textContent = 'Dismiss';
    dismiss.setAttribute('aria-label', 'Dismiss this notice');
    dismiss.addEventListener('click', () => remove(box));
    box.append(message, dismiss);
    container.append(box);
    if (fade) {
      // A notice being read (pointer over it, or focus in it) waits; it fades once left.
      const ms = kind === 'status' ? STATUS_MS : FADING_ERROR_MS;
      const hold = () => cancelLater(timers.get(box));
      const start = () => {
        hold();
        timers.set(box, later(() => fadeOut(box), ms));
      };
      box.addEventListener('mouseenter', hold);
      box.addEventListener('focusin', hold);
      box.addEventListener('mouseleave', start);
      box.addEventListener('focusout', start);
      start();
    }
    return box;
  };
}
