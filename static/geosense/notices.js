// Notices above the composer: errors and statuses the user can dismiss. Text only.

/**
 * @param {{container: HTMLElement, document?: Document}} options
 * @returns {(text: string, options?: {kind?: 'error' | 'status'}) => HTMLElement} show a notice
 */
export function createNotices({ container, document = globalThis.document }) {
  return function notice(text, { kind = 'error' } = {}) {
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
    container.append(box);
    return box;
  };
}
