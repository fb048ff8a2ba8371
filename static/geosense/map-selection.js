// The selection mode of the map: a bar with the agent's prompt, a live count, Confirm and
// Cancel; clicks on annotations (of one class, when asked) toggle them. The map draws the
// selected ids through feature state (`setState(id, on)`).

const PROMPT_MAX = 500;
const DEFAULT_PROMPT = 'Click annotations to select them.';

function button(document, text, testid, onClick) {
  const element = document.createElement('button');
  element.type = 'button';
  element.textContent = text;
  element.setAttribute('data-testid', testid);
  element.addEventListener('click', onClick);
  return element;
}

function selectionBar(document, prompt, { onConfirm, onCancel }) {
  const bar = document.createElement('div');
  bar.className = 'gs-select-bar';
  bar.setAttribute('data-testid', 'map-select-bar');
  bar.setAttribute('role', 'dialog');
  bar.setAttribute('aria-label', 'Select annotations on the map');
  const text = document.createElement('p');
  text.className = 'gs-select-prompt';
  text.textContent = prompt;
  const count = document.createElement('span');
  count.className = 'gs-select-count';
  count.setAttribute('data-testid', 'map-select-count');
  count.setAttribute('aria-live', 'polite');
  count.textContent = '0 selected';
  const actions = document.createElement('div');
  actions.className = 'gs-select-actions';
  actions.append(
    count,
    button(document, 'Confirm', 'map-select-confirm', onConfirm),
    button(document, 'Cancel', 'map-select-cancel', onCancel),
  );
  bar.append(text, actions);
  for (const type of ['click', 'dblclick', 'wheel', 'mousedown']) {
    bar.addEventListener(type, (event) => event.stopPropagation(), { passive: true });
  }
  return { bar, count };
}

/**
 * The selection controller of one map.
 *
 * @param {{container: HTMLElement, element: HTMLElement,
 *          setState: (id: number, on: boolean) => void,
 *          showClass: (name: string) => void, closePopup: () => void}} options
 */
export function createSelection({ container, element, setState, showClass, closePopup }) {
  const selected = new Set();
  let current = null;

  /**
   * Selection mode: the user clicks annotations (of `class` only, when given) to toggle them,
   * then Confirm resolves `{ids}` (sorted) and Cancel resolves null. A new select() cancels an
   * open one.
   *
   * @param {{prompt?: string, class?: string}} [options]
   * @returns {Promise<{ids: number[]} | null>}
   */
  function select({ prompt, class: onlyClass } = {}) {
    if (current) current.finish(null);
    closePopup();
    if (onlyClass) showClass(onlyClass);
    element.setAttribute('data-selecting', 'true');
    const text = typeof prompt === 'string' && prompt.trim() ? prompt.trim().slice(0, PROMPT_MAX) : DEFAULT_PROMPT;
    return new Promise((resolve) => {
      const ui = selectionBar(element.ownerDocument, text, {
        onConfirm: () => mode.finish({ ids: [...selected].sort((a, b) => a - b) }),
        onCancel: () => mode.finish(null),
      });
      container.appendChild(ui.bar);
      const mode = {
        toggle(id, name) {
          if (onlyClass && name !== onlyClass) return;
          if (selected.has(id)) selected.delete(id);
          else selected.add(id);
          setState(id, selected.has(id));
          ui.count.textContent = `${selected.size} selected`;
        },
        finish(result) {
          if (current !== mode) return;
          current = null;
          for (const id of selected) setState(id, false);
          selected.clear();
          ui.bar.remove();
          element.removeAttribute('data-selecting');
          resolve(result);
        },
      };
      current = mode;
    });
  }

  return {
    select,
    /** True when a selection is open: the click went to it (toggled or ignored). */
    click(id, name) {
      if (!current) return false;
      current.toggle(id, name);
      return true;
    },
    selectedIds: () => [...selected].sort((a, b) => a - b),
    /** Feature state is per tile data: a reload of the source keeps it, but say it again. */
    reapply() {
      for (const id of selected) setState(id, true);
    },
  };
}
