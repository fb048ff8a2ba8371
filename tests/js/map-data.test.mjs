import assert from 'node:assert/strict';
import { test } from 'node:test';

import { createMapData } from '../../static/geosense/map-data.js';

function fakeServer() {
  const calls = [];
  let revision = 'r1';
  const live = new Map([[1, ['tree', 0, 0, 1, 1]], [2, ['house', 2, 2, 3, 3]]]);
  const fetch = async (url, options = {}) => {
    calls.push([url, options.method ?? 'GET', options.body ? JSON.parse(options.body).ids : null]);
    if (url === '/tiles/annotations.json') {
      return { ok: true, json: async () => ({ revision, total: live.size, counts: {}, tiles: [] }) };
    }
    const ids = JSON.parse(options.body).ids;
    const boxes = ids.filter((id) => live.has(id)).map((id) => [id, ...live.get(id)]);
    return { ok: true, json: async () => ({ boxes }) };
  };
  return { calls, fetch, live, setRevision: (next) => { revision = next; } };
}

const document = { body: { getAttribute: () => '{"x-csrftoken": "tok"}' } };

test('locate asks the server once per id and revision, and leaves unknown ids out', async () => {
  const server = fakeServer();
  const data = createMapData({ tilesUrl: '/tiles/annotations.json', boxesUrl: '/boxes', fetch: server.fetch, document });
  await data.tileJson();

  const first = await data.locate([1, 99, 1]);
  const again = await data.locate([1, 2, 99]);
  server.live.delete(1);
  server.setRevision('r2');
  await data.tileJson();
  const afterChange = await data.locate([1, 2]);

  assert.deepEqual([...first], [[1, { box: [0, 0, 1, 1], class: 'tree' }]]);
  assert.deepEqual([...again.keys()], [1, 2]);
  assert.deepEqual([...afterChange.keys()], [2]);
  assert.deepEqual(server.calls.filter(([url]) => url === '/boxes').map(([, method, ids]) => [method, ids]), [
    ['POST', [1, 99]],
    ['POST', [2]],
    ['POST', [1, 2]],
  ]);
  assert.equal(data.revision(), 'r2');
});
