import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';

import {
  LOCATION_RACE_MS,
  LOCATION_TOOL,
  createLocationService,
} from '../../static/geosense/location.js';
import {
  fakeCards,
  fakeClock,
  fakeNavigator,
  answered,
  flush,
  schemaErrors,
  schemaKeys,
  track,
} from './location-fakes.mjs';

const produced = [];
let clock;

afterEach(() => {
  assert.equal(clock.pending(), 0, 'a race timer was left running');
});

function setUp({ state = 'prompt', permissions = true, geolocation = true, secure = true } = {}) {
  clock = fakeClock();
  const browser = fakeNavigator({ state, permissions, geolocation });
  const cards = fakeCards();
  const service = createLocationService({
    navigator: browser.nav,
    isSecureContext: secure,
    askPermission: cards.askPermission,
    setTimeout: clock.setTimeout,
    clearTimeout: clock.clearTimeout,
    now: clock.now,
  });
  const get = () => {
    const call = track(service.get());
    call.promise.then((result) => produced.push(result));
    return call;
  };
  return { browser, cards, service, get };
}

test('granted state answers GRANTED with the position and asks for a fresh one', async () => {
  const { browser, cards, get } = setUp({ state: 'granted' });
  const call = get();
  await flush();
  assert.deepEqual(browser.queries, [{ name: 'geolocation' }]);
  assert.deepEqual(browser.requests[0].options, { timeout: 5000, maximumAge: 0 });
  browser.succeed({ latitude: 48.1, longitude: 11.6, accuracy: 30, timestamp: 1_700_000_000_000 });
  assert.deepEqual(await answered(call), {
    status: 'GRANTED',
    latitude: 48.1,
    longitude: 11.6,
    accuracy: 30,
    timestamp: 1_700_000_000_000,
  });
  assert.equal(cards.shown.length, 0);
});

test('denied state answers DECLINED at once without a card or a browser request', async () => {
  const { browser, cards, get } = setUp({ state: 'denied' });
  const result = await answered(get());
  assert.equal(result.status, 'DECLINED');
  assert.match(result.message, /Do not retry/);
  assert.equal(cards.shown.length, 0);
  assert.equal(browser.requests.length, 0);
});

test('an insecure page answers UNAVAILABLE without asking anything', async () => {
  const { browser, cards, get } = setUp({ state: 'granted', secure: false });
  const result = await answered(get());
  assert.equal(result.status, 'UNAVAILABLE');
  assert.match(result.message, /Do not retry/);
  assert.equal(browser.queries.length, 0);
  assert.equal(cards.shown.length, 0);
});

test('a browser without geolocation answers UNAVAILABLE without a card', async () => {
  const { cards, get } = setUp({ geolocation: false });
  const result = await answered(get());
  assert.equal(result.status, 'UNAVAILABLE');
  assert.equal(cards.shown.length, 0);
});

test('a missing permissions API falls back to the card', async () => {
  const { browser, cards, get } = setUp({ permissions: false });
  const call = get();
  await flush();
  assert.equal(cards.shown.length, 1);
  assert.equal(browser.requests.length, 0, 'the browser prompt waits for Allow');
  cards.shown[0].allow();
  await flush();
  browser.succeed();
  assert.equal((await answered(call)).status, 'GRANTED');
});

test('a rejecting permissions query falls back to the card', async () => {
  const { browser, cards, get } = setUp();
  browser.nav.permissions.query = () => Promise.reject(new TypeError('geolocation not supported'));
  const call = get();
  await flush();
  assert.equal(cards.shown.length, 1);
  cards.shown[0].deny();
  assert.equal((await answered(call)).status, 'DECLINED');
});

test('prompt state shows the card first and Allow then asks the browser', async () => {
  const { browser, cards, get } = setUp({ state: 'prompt' });
  const call = get();
  await flush();
  assert.equal(cards.shown.length, 1);
  assert.equal(browser.requests.length, 0);
  cards.shown[0].allow();
  await flush();
  assert.equal(browser.requests.length, 1);
  assert.deepEqual(browser.requests[0].options, { timeout: 5000, maximumAge: 0 });
  browser.succeed({ accuracy: 12 });
  const result = await answered(call);
  assert.equal(result.status, 'GRANTED');
  assert.deepEqual(cards.shown[0].closed, [result], 'the card shows the outcome');
});

test('Not now on the card answers DECLINED without a browser prompt', async () => {
  const { browser, cards, get } = setUp({ state: 'prompt' });
  const call = get();
  await flush();
  cards.shown[0].deny();
  const result = await answered(call);
  assert.equal(result.status, 'DECLINED');
  assert.match(result.message, /Do not retry/);
  assert.equal(browser.requests.length, 0);
  assert.deepEqual(cards.shown[0].closed, [result]);
});

test('an unanswered card answers PENDING at five seconds and not before, card still open', async () => {
  const { cards, get, service } = setUp({ state: 'prompt' });
  const call = get();
  await clock.advance(LOCATION_RACE_MS - 1);
  assert.equal(call.settled, false);
  await clock.advance(1);
  assert.equal(call.settled, true);
  assert.equal(call.value.status, 'PENDING');
  assert.match(call.value.message, /call location_get again after a short wait/);
  assert.equal(cards.shown.length, 1);
  assert.deepEqual(cards.shown[0].closed, [], 'the card stays open after PENDING');
  assert.notEqual(service.pendingRequest, null);
  cards.shown[0].deny();
  await flush();
  assert.equal(service.pendingRequest, null);
});

test('Allow after PENDING lets the next call answer GRANTED without a second card', async () => {
  const { browser, cards, get, service } = setUp({ state: 'prompt' });
  const first = get();
  await clock.advance(LOCATION_RACE_MS);
  assert.equal(first.value.status, 'PENDING');

  cards.shown[0].allow();
  await flush();
  browser.succeed({ latitude: 40.4, longitude: -3.7, accuracy: 80 });
  await flush();
  assert.equal(service.pendingRequest, null, 'a settled request is not kept as a cache');

  const second = get();
  await flush();
  assert.equal(browser.queries.length, 2, 'the second call asks the browser again');
  browser.succeed({ latitude: 40.41, longitude: -3.71, accuracy: 20 });
  const result = await answered(second);
  assert.equal(result.status, 'GRANTED');
  assert.equal(result.accuracy, 20);
  assert.equal(cards.shown.length, 1);
});

test('a call while the card is still open joins it with its own race', async () => {
  const { browser, cards, get } = setUp({ state: 'prompt' });
  const first = get();
  await clock.advance(LOCATION_RACE_MS);
  assert.equal(first.value.status, 'PENDING');

  await clock.advance(60_000);
  const second = get();
  await clock.advance(2000);
  assert.equal(second.settled, false, 'the second call has a fresh five seconds');
  cards.shown[0].allow();
  await flush();
  browser.succeed();
  assert.equal((await answered(second)).status, 'GRANTED');
  assert.equal(cards.shown.length, 1);
  assert.equal(browser.requests.length, 1);
});

test('a joined call still unanswered after its own five seconds answers PENDING', async () => {
  const { cards, get } = setUp({ state: 'prompt' });
  get();
  await clock.advance(3000);
  const second = get();
  await clock.advance(2000);
  assert.equal(second.settled, false);
  await clock.advance(3000);
  assert.equal(second.value.status, 'PENDING');
  assert.equal(cards.shown.length, 1);
  cards.shown[0].deny();
  await flush();
});

test('two concurrent calls share one card and one browser request', async () => {
  const { browser, cards, get } = setUp({ state: 'prompt' });
  const first = get();
  const second = get();
  await flush();
  assert.equal(cards.shown.length, 1);
  cards.shown[0].allow();
  await flush();
  browser.succeed();
  const [a, b] = [await answered(first), await answered(second)];
  assert.equal(a.status, 'GRANTED');
  assert.deepEqual(a, b);
  assert.equal(browser.requests.length, 1);
  assert.equal(browser.queries.length, 1);
});

test('two concurrent calls in granted state make one browser request', async () => {
  const { browser, get } = setUp({ state: 'granted' });
  const first = get();
  const second = get();
  await flush();
  browser.succeed();
  await answered(first);
  await answered(second);
  assert.equal(browser.requests.length, 1);
});

test('a browser refusal (code 1) answers DECLINED', async () => {
  const { browser, cards, get } = setUp({ state: 'prompt' });
  const call = get();
  await flush();
  cards.shown[0].allow();
  await flush();
  browser.fail(1);
  const result = await answered(call);
  assert.equal(result.status, 'DECLINED');
  assert.match(result.message, /Do not retry/);
});

for (const code of [2, 3]) {
  test(`a position error with code ${code} answers UNAVAILABLE`, async () => {
    const { browser, get } = setUp({ state: 'granted' });
    const call = get();
    await flush();
    browser.fail(code);
    const result = await answered(call);
    assert.equal(result.status, 'UNAVAILABLE');
    assert.match(result.message, /Do not retry/);
  });
}

test('a granted browser that never calls back answers PENDING at five seconds', async () => {
  const { browser, cards, get } = setUp({ state: 'granted' });
  const call = get();
  await clock.advance(LOCATION_RACE_MS - 1);
  assert.equal(call.settled, false);
  await clock.advance(1);
  assert.equal(call.value.status, 'PENDING');
  assert.equal(cards.shown.length, 0);
  browser.fail(3);
  await flush();
});

test('an exception thrown by getCurrentPosition answers UNAVAILABLE', async () => {
  const { browser, get } = setUp({ state: 'granted' });
  browser.nav.geolocation.getCurrentPosition = () => {
    throw new Error('blocked by permissions policy');
  };
  const result = await answered(get());
  assert.equal(result.status, 'UNAVAILABLE');
  assert.equal(typeof result.message, 'string');
});

test('an exception thrown by the card answers UNAVAILABLE', async () => {
  clock = fakeClock();
  const browser = fakeNavigator({ state: 'prompt' });
  const service = createLocationService({
    navigator: browser.nav,
    isSecureContext: true,
    askPermission: () => {
      throw new Error('no transcript');
    },
    setTimeout: clock.setTimeout,
    clearTimeout: clock.clearTimeout,
    now: clock.now,
  });
  assert.equal((await answered(track(service.get()))).status, 'UNAVAILABLE');
});

test('a throwing geolocation getter answers UNAVAILABLE instead of rejecting', async () => {
  const { browser, get } = setUp({ state: 'granted' });
  Object.defineProperty(browser.nav, 'geolocation', {
    get() {
      throw new Error('sandboxed frame');
    },
  });
  assert.equal((await answered(get())).status, 'UNAVAILABLE');
});

test('a position without a timestamp is stamped with the current time', async () => {
  const { browser, get } = setUp({ state: 'granted' });
  const call = get();
  await flush();
  browser.requests[0].success({ coords: { latitude: 1, longitude: 2, accuracy: 3 } });
  assert.equal((await answered(call)).timestamp, clock.now());
});

test('a failed request is not remembered: the next call asks again', async () => {
  const { browser, get } = setUp({ state: 'granted' });
  const first = get();
  await flush();
  browser.fail(2);
  assert.equal((await answered(first)).status, 'UNAVAILABLE');
  const second = get();
  await flush();
  browser.succeed();
  assert.equal((await answered(second)).status, 'GRANTED');
  assert.equal(browser.requests.length, 2);
});

test('the tool is a blocking, served location_get without arguments', () => {
  assert.equal(LOCATION_TOOL.kind, 'blocking');
  assert.equal(LOCATION_TOOL.name, 'location_get');
  assert.equal(LOCATION_TOOL.serve, true);
  assert.deepEqual(LOCATION_TOOL.arguments, { type: 'object', properties: {}, additionalProperties: false });
  assert.deepEqual(JSON.parse(JSON.stringify(LOCATION_TOOL)), LOCATION_TOOL, 'it survives the socket frame');
});

test('the description tells the model which statuses are terminal and what accuracy means', () => {
  const { description } = LOCATION_TOOL;
  assert.ok(description.length <= 600, `description is ${description.length} characters`);
  for (const status of ['GRANTED', 'DECLINED', 'PENDING', 'UNAVAILABLE']) {
    assert.ok(description.includes(status), status);
  }
  assert.match(description, /DECLINED[^.]*\. Do not retry/);
  assert.match(description, /UNAVAILABLE[^.]*\. Do not retry/);
  assert.match(description, /PENDING[^.]*\. You may call location_get again after a short wait/);
  assert.match(description, /radius in metres/);
});

test('the schemas carry no pattern or patternProperties at any depth', () => {
  const keys = [...schemaKeys(LOCATION_TOOL.arguments), ...schemaKeys(LOCATION_TOOL.result)];
  assert.ok(!keys.includes('pattern'));
  assert.ok(!keys.includes('patternProperties'));
});

test('the result schema refuses shapes outside the contract', () => {
  const schema = LOCATION_TOOL.result;
  assert.notDeepEqual(schemaErrors(schema, { status: 'PENDING' }), []);
  assert.notDeepEqual(schemaErrors(schema, { status: 'GRANTED', latitude: 1, longitude: 2 }), []);
  assert.notDeepEqual(schemaErrors(schema, { status: 'LOST', message: 'x' }), []);
  assert.notDeepEqual(schemaErrors(schema, { status: 'DECLINED', message: 'x', extra: 1 }), []);
  assert.deepEqual(schemaErrors(schema, { status: 'DECLINED', message: 'x' }), []);
});

// Runs last: every result the tests above produced must validate against the declared schema.
test('every produced result validates against the result schema', () => {
  const statuses = new Set(produced.map((result) => result.status));
  assert.deepEqual([...statuses].sort(), ['DECLINED', 'GRANTED', 'PENDING', 'UNAVAILABLE']);
  for (const result of produced) {
    assert.deepEqual(schemaErrors(LOCATION_TOOL.result, result), [], JSON.stringify(result));
  }
});
