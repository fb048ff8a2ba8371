// Draws a highlight on the WebGL map: the highlighted and link-target ids as overlay layers
// (an id filter: cheap for 100,000 ids), the link lines as a GeoJSON source, the link labels
// as HTML over the map (only those in view, at most LABEL_LIMIT, decluttered), and the bar
// with the counts, the hints for the whole set and "Clear highlight".

import { declutter, highlightFeatures, highlightPlan, hintTexts, idsToLocate, labelsInView } from './map-highlight-plan.js';
import { HIGHLIGHT } from './map-style.js';
import { boundsOf } from './map-view.js';

const LABEL_LIMIT = 300;

function highlightBar(document, plan, overall, onClear) {
  const box = document.createElement('div');
  box.className = 'gs-highlight-bar';
  box.setAttribute('role', 'status');
  box.setAttribute('data-testid', 'map-highlight-bar');
  const text = document.createElement('span');
  text.textContent = `${plan.shown.length.toLocaleString('en-US')} highlighted`
    + (plan.missing.length ? ` · ${plan.missing.length} not on the map` : '');
  box.appendChild(text);
  for (const [key, value] of overall) {
    const hint = document.createElement('span');
    hint.className = 'gs-highlight-hint';
    hint.textContent = `${key}: ${value}`;
    box.appendChild(hint);
  }
  const clear = document.createElement('button');
  clear.type = 'button';
  clear.textContent = 'Clear highlight';
  clear.setAttribute('data-testid', 'map-clear-highlight');
  clear.addEventListener('click', onClear);
  box.appendChild(clear);
  box.addEventListener('click', (event) => event.stopPropagation());
  return box;
}

/**
 * @param {{map: object, container: HTMLElement, barSlot: HTMLElement,
 *          locate: (ids: number[]) => Promise<Map<number, {box: number[], class: string}>>,
 *          setOverlay: (name: 'highlighted' | 'linkTargets', ids: number[]) => void,
 *          showClasses: (names: Iterable<string>) => void,
 *          fit: (bounds: number[]) => void}} options
 */
export function createHighlight({ map, container, barSlot, locate, setOverlay, showClasses, fit }) {
  const document = container.ownerDocument;
  const layer = document.createElement('div');
  layer.className = 'gs-link-labels';
  container.appendChild(layer);
  let plan = null;
  let hints = new Map();
  let bar = null;
  let generation = 0;
  let frame = 0;

  function drawLabels() {
    frame = 0;
    layer.replaceChildren();
    if (!plan?.links.length) return;
    const b = map.getBounds();
    const shown = labelsInView(plan.links, [b.getWest(), b.getSouth(), b.getEast(), b.getNorth()], LABEL_LIMIT);
    const elements = shown.map((link) => {
      const point = map.project(link.middle);
      const label = document.createElement('div');
      label.className = 'gs-link-label';
      label.setAttribute('data-testid', 'link-label');
      label.setAttribute('data-link-index', String(link.index));
      label.textContent = link.label;
      label.style.transform = `translate(${point.x}px, ${point.y}px) translate(-50%, -50%)`;
      layer.appendChild(label);
      return label;
    });
    const hidden = declutter(elements.map((element) => element.getBoundingClientRect()));
    elements.forEach((element, i) => element.classList.toggle('gs-label-hidden', hidden[i]));
  }
  const scheduleLabels = () => {
    if (!frame) frame = requestAnimationFrame(drawLabels);
  };
  map.on('move', scheduleLabels);

  /** Undo the current highlight: overlays, link lines and labels, and the bar. */
  function clear() {
    generation += 1;
    plan = null;
    hints = new Map();
    setOverlay('highlighted', []);
    setOverlay('linkTargets', []);
    map.getSource(HIGHLIGHT)?.setData(highlightFeatures([]));
    layer.replaceChildren();
    bar?.remove();
    bar = null;
  }

  /**
   * Apply a highlight payload (the highlight block's data): mark `ids`, draw a line from
   * ids[i] to links[i] labelled with the formatted linkValues[i], keep the attribute hints
   * for the popups, and fit the map to everything involved. Replaces any earlier highlight.
   *
   * @returns {Promise<{shown: number[], missing: number[]}>}
   */
  async function highlight(data) {
    clear();
    const mine = generation;
    const payload = data && typeof data === 'object' ? data : {};
    const boxes = await locate(idsToLocate(payload));
    if (mine !== generation) return { shown: [], missing: [] };
    plan = highlightPlan(payload, boxes);
    hints = hintTexts(payload).perFeature;
    showClasses(plan.classes);
    setOverlay('highlighted', plan.shown);
    setOverlay('linkTargets', plan.linkTargets);
    map.getSource(HIGHLIGHT)?.setData(highlightFeatures(plan.links, plan.shown.map((id) => [id, boxes.get(id).box])));
    bar = highlightBar(document, plan, hintTexts(payload).overall, clear);
    barSlot.appendChild(bar);
    const bounds = boundsOf([...plan.shown, ...plan.linkTargets].map((id) => boxes.get(id).box));
    if (bounds) fit(bounds);
    drawLabels();
    return { shown: plan.shown, missing: plan.missing };
  }

  return {
    highlight,
    clear,
    highlightedIds: () => (plan ? [...plan.shown] : []),
    linkTargetIds: () => (plan ? [...plan.linkTargets] : []),
    links: () => (plan ? plan.links.map(({ index, id, target, label }) => ({ index, id, target, label })) : []),
    hintsFor: (id) => hints.get(id) ?? [],
    /** The labels on screen now, for the image context: text and container position. */
    visibleLabels() {
      const origin = container.getBoundingClientRect();
      return [...layer.querySelectorAll('.gs-link-label:not(.gs-label-hidden)')].map((element) => {
        const box = element.getBoundingClientRect();
        return { text: element.textContent, x: box.left - origin.left + box.width / 2, y: box.top - origin.top + box.height / 2 };
      });
    },
  };
}
