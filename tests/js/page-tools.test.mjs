import assert from 'node:assert/strict';
import { test } from 'node:test';

import { LOCATION_TOOL } from '../../static/geosense/location.js';
import {
  MAP_FOCUS_TOOL,
  MAP_GET_VIEW_TOOL,
  MAP_SELECT_TOOL,
  applyOneWay,
  pageClientTools,
  selectionResult,
} from '../../static/geosense/page-tools.js';
import { schemaErrors, schemaKeys } from './location-fakes.mjs';

const VIEW = {
  center: { lat: 52.5, lon: 13.4 },
  zoom: 17.25,
  bounds: [13.39, 52.49, 13.41, 52.51],
  visible_classes: ['house', 'tree'],
};

function fakeMap({ selection = null } = {}) {
  const calls = { focus: [], select: [] };
  return {
    calls,
    view: () => VIEW,
    focus(ids) {
      calls.focus.push(ids);
      return ids;
    },
    async select(options) {
      calls.select.push(options);
      return selection;
    },
  };
}

const byName = (tools, name) => tools.find((tool) => tool.declaration.name === name);

test('the page declares its four tools with the kinds the server expects', () => {
  const tools = pageClientTools({ map: fakeMap(), location: { get: async () => ({}) } });

  assert.deepEqual(
    tools.map((t) => [t.declaration.name, t.declaration.kind, t.declaration.serve]),
    [
      ['map_get_view', 'blocking', true],
      ['map_focus', 'one-way', undefined],
      ['map_select', 'blocking', false],
      ['location_get', 'blocking', true],
    ],
  );
  assert.equal(byName(tools, 'location_get').declaration, LOCATION_TOOL);
  assert.equal(typeof byName(tools, 'map_get_view').serve, 'function');
  assert.equal(typeof byName(tools, 'location_get').serve, 'function');
  assert.equal(byName(tools, 'map_select').serve, undefined, 'the reader answers map_select');
  assert.equal(byName(tools, 'map_focus').serve, undefined, 'a one-way tool is not answered');
});

test('no declaration uses pattern or patternProperties', () => {
  for (const tool of [MAP_GET_VIEW_TOOL, MAP_FOCUS_TOOL, MAP_SELECT_TOOL]) {
    const keys = schemaKeys(tool);
    assert.ok(!keys.includes('pattern') && !keys.includes('patternProperties'), tool.name);
  }
});

test('map_get_view is served from the map view and fits its result schema', async () => {
  const tools = pageClientTools({ map: fakeMap(), location: { get: async () => ({}) } });

  const result = await byName(tools, 'map_get_view').serve({});

  assert.deepEqual(result, VIEW);
  assert.deepEqual(schemaErrors(MAP_GET_VIEW_TOOL.result, result), []);
});

test('location_get is served by the location service', async () => {
  const answer = { status: 'PENDING', message: 'not yet' };
  const tools = pageClientTools({ map: fakeMap(), location: { get: async () => answer } });

  assert.equal(await byName(tools, 'location_get').serve({}), answer);
});

test('map_focus is applied with the integer ids only', () => {
  const map = fakeMap();
  const tools = pageClientTools({ map, location: { get: async () => ({}) } });

  assert.equal(tools.applyOneWay('map_focus', { ids: [12, '13', 1.5, 14] }), true);
  assert.equal(applyOneWay('map_focus', { ids: 'nope' }, { map }), true);
  assert.equal(applyOneWay('map_get_view', {}, { map }), false);
  assert.deepEqual(map.calls.focus, [[12, 14]]);
});

test('map_select answers the confirmed ids and hands them to onSelect', async () => {
  const map = fakeMap({ selection: { ids: [3, 7] } });
  const seen = [];
  const tools = pageClientTools({
    map,
    location: { get: async () => ({}) },
    onSelect: (result, args) => seen.push([result, args]),
  });
  const args = { prompt: 'Pick the pools', class: 'pool' };

  const result = await byName(tools, 'map_select').answer(args);

  assert.deepEqual(result, { ids: [3, 7] });
  assert.deepEqual(map.calls.select, [{ prompt: 'Pick the pools', class: 'pool' }]);
  assert.deepEqual(seen, [[{ ids: [3, 7] }, args]]);
  assert.deepEqual(schemaErrors(MAP_SELECT_TOOL.result, result), []);
});

test('a cancelled selection answers no ids and says so', async () => {
  const tools = pageClientTools({ map: fakeMap({ selection: null }), location: { get: async () => ({}) } });

  const result = await byName(tools, 'map_select').answer({ prompt: 'Pick' });

  assert.deepEqual(result, { ids: [], cancelled: true });
  assert.deepEqual(selectionResult({ ids: [1] }), { ids: [1] });
});

test('every page tool names itself and its calls for a person', () => {
  for (const tool of [LOCATION_TOOL, MAP_GET_VIEW_TOOL, MAP_FOCUS_TOOL, MAP_SELECT_TOOL]) {
    assert.ok(tool.title && !tool.title.includes('_'), tool.name);
    assert.equal(typeof tool.summary, 'string', tool.name);
    for (const [, name] of tool.summary.matchAll(/\{([\w-]+)(?::\w+)?\}/g)) {
      assert.ok(name in tool.arguments.properties, `${tool.name}: {${name}}`);
    }
  }
});
