// The page's layout state at narrow widths (app.css, "Layout at every width"): the
// conversations drawer (tablets and phones) and the map/chat switch (phones). The state lives on
// the main element, which htmx never swaps, so it survives a conversation switch; on a desktop
// the same attributes change nothing.

/**
 * @param {{main: HTMLElement, document?: Document}} options
 * @returns {{setView: (view: 'chat' | 'map') => void, setDrawer: (open: boolean) => void}}
 */
export function wireLayout({ main, document = globalThis.document }) {
  const toggle = document.getElementById('drawer-toggle');
  const switchButtons = () => main.querySelectorAll('.view-switch [data-view]');

  function setDrawer(open) {
    const wasOpen = main.dataset.drawer === 'open';
    main.dataset.drawer = open ? 'open' : 'closed';
    toggle?.setAttribute('aria-expanded', open ? 'true' : 'false');
    if (open) {
      // The list is hidden until the transition starts: focus it on the next frame.
      const first = () => document.querySelector('#sessions [aria-current="page"], #sessions a');
      requestAnimationFrame(() => first()?.focus());
    } else if (wasOpen && document.getElementById('sessions')?.contains(document.activeElement)) {
      toggle?.focus();
    }
  }

  function setView(view) {
    main.dataset.view = view;
    for (const button of switchButtons()) {
      button.setAttribute('aria-pressed', button.dataset.view === view ? 'true' : 'false');
      if (button.dataset.view === view) markNews(button, false);
    }
  }

  /** A dot on a switch's button: its hidden view changed (a highlight on the map). */
  function markNews(button, on) {
    if (on) {
      button.dataset.news = 'true';
      button.title = 'Something new is shown on the map';
    } else {
      delete button.dataset.news;
      button.removeAttribute('title');
    }
  }

  toggle?.addEventListener('click', () => setDrawer(main.dataset.drawer !== 'open'));
  document.addEventListener('keydown', (event) => {
    if (main.dataset.drawer !== 'open') return;
    if (event.key === 'Escape') setDrawer(false);
    // An open drawer covers the page: Tab and Shift+Tab go round its own controls (only
    // where it is a drawer: on a desktop the list is a column of the page).
    const isDrawer = toggle?.getClientRects().length > 0;
    if (event.key === 'Tab' && isDrawer) keepFocusIn(document.getElementById('sessions'), event, document);
  });
  main.addEventListener('click', (event) => {
    const target = event.target;
    const button = target.closest('.view-switch [data-view]');
    if (button) setView(button.dataset.view);
    // Choosing a conversation (or a new one) closes the drawer, as does its backdrop.
    if (target.closest('[data-drawer-close], #sessions a')) setDrawer(false);
    // On a phone, asking to see something on the map shows the map.
    if (target.closest('.highlight-apply, .chip[data-annotation-id]')) setView('map');
  });

  main.addEventListener('geosense:highlight-shown', () => {
    const mapPanel = main.querySelector('.map-panel');
    if (!mapPanel || getComputedStyle(mapPanel).visibility !== 'hidden') return;
    const button = main.querySelector('.view-switch [data-view="map"]');
    if (button) markNews(button, true);
  });

  setView(main.dataset.view || 'chat');
  setDrawer(false);
  return { setView, setDrawer };
}

const FOCUSABLE = 'a[href], button:not([disabled]), input:not([disabled]), [tabindex]:not([tabindex="-1"])';

/** Tab from the drawer's last control goes to its first, Shift+Tab from its first to its last;
 * focus outside the drawer comes back into it. The drawer is swapped by htmx (the list's
 * refresh), so its controls are read at each press. */
function keepFocusIn(container, event, document) {
  if (!container) return;
  const controls = [...container.querySelectorAll(FOCUSABLE)].filter(
    (element) => element.getClientRects().length > 0,
  );
  if (!controls.length) return;
  const first = controls[0];
  const last = controls[controls.length - 1];
  const active = document.activeElement;
  let next = null;
  if (!container.contains(active)) next = event.shiftKey ? last : first;
  else if (event.shiftKey && active === first) next = last;
  else if (!event.shiftKey && active === last) next = first;
  if (next) {
    event.preventDefault();
    next.focus();
  }
}
