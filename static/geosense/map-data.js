// What the map asks the server: the annotation tiles' JSON (revision, counts per class for the
// whole dataset, bounds, tile URLs) and where given ids are (their boxes and classes, for a
// highlight's fit and link lines, and a focus). Boxes are kept per revision.

import { csrfToken } from './http.js';

const LOCATE_BATCH = 100_000;

/**
 * @param {{tilesUrl: string, boxesUrl: string, fetch?: typeof fetch, document?: Document}} options
 */
export function createMapData({ tilesUrl, boxesUrl, fetch = globalThis.fetch, document = globalThis.document }) {
  let boxes = new Map(); // id → {box, class}, or null for an id the server does not have
  let revision = null;

  /** The tile JSON now; a new revision forgets the boxes known so far. */
  async function tileJson() {
    const response = await fetch(tilesUrl, { credentials: 'same-origin', headers: { Accept: 'application/json' } });
    if (!response.ok) throw new Error(`loading the map tiles failed: HTTP ${response.status}`);
    const json = await response.json();
    if (json.revision !== revision) {
      revision = json.revision;
      boxes = new Map();
    }
    return json;
  }

  async function fetchBoxes(ids) {
    const response = await fetch(boxesUrl, {
      method: 'POST',
      credentials: 'same-origin',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json', 'X-CSRFToken': csrfToken(document) },
      body: JSON.stringify({ ids }),
    });
    if (!response.ok) throw new Error(`locating annotations failed: HTTP ${response.status}`);
    const found = new Map();
    for (const [id, name, w, s, e, n] of (await response.json()).boxes ?? []) found.set(id, { box: [w, s, e, n], class: name });
    return found;
  }

  /**
   * The live annotations among `ids`, as id → {box: [w, s, e, n], class}; unknown and
   * deleted ids are left out.
   *
   * @param {number[]} ids
   * @returns {Promise<Map<number, {box: number[], class: string}>>}
   */
  async function locate(ids) {
    const wanted = [...new Set(ids)].filter((id) => !boxes.has(id));
    for (let start = 0; start < wanted.length; start += LOCATE_BATCH) {
      const batch = wanted.slice(start, start + LOCATE_BATCH);
      const found = await fetchBoxes(batch);
      for (const id of batch) boxes.set(id, found.get(id) ?? null);
    }
    const out = new Map();
    for (const id of ids) if (boxes.get(id)) out.set(id, boxes.get(id));
    return out;
  }

  return { tileJson, locate, revision: () => revision };
}
