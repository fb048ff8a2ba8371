// The chat page's client tools: what the agent may ask of this tab. The socket registers the
// declarations after every (re)connect and bind, and answers an invoke with the entry's
// `serve`. A served tool answers by itself; map_select is answered by the reader (a card),
// so the server turns its call into the turn's pending decision; map_focus is one-way and
// applied when its client_tool_call event arrives. No schema uses `pattern` (the server
// refuses it: regex dialects differ between validators).

import { LOCATION_TOOL } from './location.js';
import { clientToolDeclaration } from './wire.js';

const NO_ARGUMENTS = Object.freeze({ type: 'object', properties: {}, additionalProperties: false });
const ID_LIST = Object.freeze({ type: 'array', items: { type: 'integer' }, minItems: 1, maxItems: 500 });
const FOCUS_MAX_IDS = 500;

export const MAP_GET_VIEW_TOOL = clientToolDeclaration({
  kind: 'blocking',
  name: 'map_get_view',
  title: "Read the map's view",
  summary: 'Where your map is, its zoom and the classes it shows',
  description:
    "Returns what the user's map shows right now: center {lat, lon} in WGS84 degrees, zoom " +
    '(web-map zoom of 256-px tiles: 0 is the whole world, 19 a house), bounds [minLon, minLat, ' +
    'maxLon, maxLat] and visible_classes (the annotation classes the user has not hidden). ' +
    'Use bounds as a bbox for spatial tools.',
  arguments: NO_ARGUMENTS,
  result: {
    type: 'object',
    properties: {
      center: {
        type: 'object',
        properties: {
          lat: { type: 'number', minimum: -90, maximum: 90 },
          lon: { type: 'number', minimum: -180, maximum: 180 },
        },
        required: ['lat', 'lon'],
      },
      zoom: { type: 'number' },
      bounds: { type: 'array', items: { type: 'number' }, minItems: 4, maxItems: 4 },
      visible_classes: { type: 'array', items: { type: 'string' } },
    },
    required: ['center', 'zoom', 'bounds', 'visible_classes'],
  },
  serve: true,
});

export const MAP_FOCUS_TOOL = clientToolDeclaration({
  kind: 'one-way',
  name: 'map_focus',
  title: 'Show annotations on the map',
  summary: '{ids:ids}',
  description:
    "Pans and zooms the user's map to these annotation ids and makes them flash. One-way: " +
    'nothing is returned, so do not wait for an answer; ids not on the map are skipped.',
  arguments: {
    type: 'object',
    properties: { ids: ID_LIST },
    required: ['ids'],
    additionalProperties: false,
  },
});

export const MAP_SELECT_TOOL = clientToolDeclaration({
  kind: 'blocking',
  name: 'map_select',
  title: 'Pick annotations on the map',
  summary: '[Only {class:class}: ]{prompt}',
  description:
    'Asks the user to pick annotations on the map: they see your prompt, click annotations ' +
    '(only of `class`, when given) and confirm or cancel. Returns {ids} of the picked ' +
    'annotations, or {ids: [], cancelled: true}. The turn waits for the user, who may take long.',
  arguments: {
    type: 'object',
    properties: {
      prompt: { type: 'string', minLength: 1, maxLength: 500 },
      class: { type: 'string', minLength: 1, maxLength: 64 },
    },
    required: ['prompt'],
    additionalProperties: false,
  },
  result: {
    type: 'object',
    properties: {
      ids: { type: 'array', items: { type: 'integer' } },
      cancelled: { type: 'boolean' },
    },
    required: ['ids'],
  },
  serve: false,
});

/**
 * Applies a one-way client-tool call on the page. Returns true when `name` is a one-way tool
 * of the page (map_focus), false otherwise; malformed arguments do nothing.
 *
 * @param {string} name
 * @param {object} args
 * @param {{map: {focus(ids: number[]): number[]}}} page
 */
export function applyOneWay(name, args, { map }) {
  if (name !== MAP_FOCUS_TOOL.name) return false;
  const ids = Array.isArray(args?.ids) ? args.ids.filter(Number.isInteger).slice(0, FOCUS_MAX_IDS) : [];
  if (ids.length) map.focus(ids);
  return true;
}

/**
 * The map_select result for a selection (`{ids}`, or null when the reader cancelled).
 *
 * @param {{ids: number[]} | null} selection
 * @returns {{ids: number[], cancelled?: true}}
 */
export function selectionResult(selection) {
  if (!selection) return { ids: [], cancelled: true };
  return { ids: [...selection.ids] };
}

/**
 * The page's client tools, as `{declaration, serve?, answer?}` entries: `serve(args)` answers
 * an invoke (map_get_view, location_get); map_select has `answer(args)`, which the reader's
 * card calls: it runs the map's selection mode and resolves the result to resume the turn
 * with (and hands it to `onSelect`, when given). The array also carries
 * `applyOneWay(name, args)` bound to this map.
 *
 * @param {object} page
 * @param {{view(): object, focus(ids: number[]): number[],
 *          select(options: {prompt?: string, class?: string}): Promise<{ids: number[]} | null>}} page.map
 * @param {{get(): Promise<object>}} page.location the location service (location.js)
 * @param {(result: {ids: number[], cancelled?: true}, args: object) => void} [page.onSelect]
 */
export function pageClientTools({ map, location, onSelect }) {
  const tools = [
    { declaration: MAP_GET_VIEW_TOOL, serve: async () => map.view() },
    { declaration: MAP_FOCUS_TOOL },
    {
      declaration: MAP_SELECT_TOOL,
      async answer(args = {}) {
        const result = selectionResult(await map.select({ prompt: args.prompt, class: args.class }));
        if (onSelect) onSelect(result, args);
        return result;
      },
    },
    { declaration: LOCATION_TOOL, serve: () => location.get() },
  ];
  tools.applyOneWay = (name, args) => applyOneWay(name, args, { map });
  return tools;
}
