import assert from 'node:assert/strict';
import { test } from 'node:test';

import { createLocationCard } from '../../static/geosense/location-card.js';
import { createLocationService } from '../../static/geosense/location.js';
import { answered, fakeClock, fakeDocument, fakeNavigator, flush, track } from './location-fakes.mjs';

function setUp() {
  const document = fakeDocument();
  const transcript = document.createElement('div');
  const askPermission = createLocationCard({ place: (card) => transcript.appendChild(card), document });
  return { transcript, askPermission };
}

test('the card asks in the transcript with an Allow and a Not now button', () => {
  const { transcript, askPermission } = setUp();
  askPermission();
  const card = transcript.byTestId('location-card');
  assert.ok(card);
  assert.equal(card.getAttribute('role'), 'region');
  const heading = card.children.find((child) => child.tagName === 'H3');
  assert.equal(heading.textContent, 'Share your location?');
  assert.equal(card.getAttribute('aria-labelledby'), heading.getAttribute('id'));
  assert.match(card.textContent, /The assistant would like to use your location to answer your question\./);
  assert.equal(card.byTestId('location-allow').textContent, 'Allow');
  assert.equal(card.byTestId('location-deny').textContent, 'Not now');
  assert.equal(card.byTestId('location-allow').getAttribute('type'), 'button');
});

test('two cards get distinct heading ids', () => {
  const { transcript, askPermission } = setUp();
  askPermission();
  askPermission();
  const [first, second] = transcript.children;
  assert.notEqual(first.getAttribute('aria-labelledby'), second.getAttribute('aria-labelledby'));
});

test('Allow answers allow and removes the buttons', async () => {
  const { transcript, askPermission } = setUp();
  const { answer } = askPermission();
  const allow = transcript.byTestId('location-allow');
  allow.click();
  assert.equal(await answer, 'allow');
  assert.equal(transcript.byTestId('location-allow'), null);
  assert.equal(transcript.byTestId('location-deny'), null);
  assert.equal(allow.disabled, true);
});

test('pressing twice answers once with the first choice', async () => {
  const { transcript, askPermission } = setUp();
  const { answer } = askPermission();
  const allow = transcript.byTestId('location-allow');
  const deny = transcript.byTestId('location-deny');
  deny.click();
  allow.disabled = false; // even if something re-enabled it, the card stays answered
  allow.click();
  deny.click();
  assert.equal(await answer, 'deny');
  assert.equal(transcript.byTestId('location-status').textContent, 'Location not shared.');
});

test('the card shows the outcome it is closed with', async () => {
  const { transcript, askPermission } = setUp();
  const { answer, close } = askPermission();
  transcript.byTestId('location-allow').click();
  await answer;
  assert.equal(transcript.byTestId('location-status').textContent, 'Waiting for your browser…');
  close({ status: 'GRANTED', latitude: 1, longitude: 2, accuracy: 24.6, timestamp: 3 });
  assert.equal(transcript.byTestId('location-status').textContent, 'Location shared (within about 25 m).');
  assert.equal(transcript.byTestId('location-card').getAttribute('data-testid'), 'location-card');
});

test('the card drives the service: Not now answers DECLINED and the card says so', async () => {
  const { transcript, askPermission } = setUp();
  const clock = fakeClock();
  const browser = fakeNavigator({ state: 'prompt' });
  const service = createLocationService({
    navigator: browser.nav,
    isSecureContext: true,
    askPermission,
    setTimeout: clock.setTimeout,
    clearTimeout: clock.clearTimeout,
    now: clock.now,
  });
  const call = track(service.get());
  await flush();
  transcript.byTestId('location-deny').click();
  assert.equal((await answered(call)).status, 'DECLINED');
  assert.equal(transcript.byTestId('location-status').textContent, 'Location not shared.');
  assert.equal(browser.requests.length, 0);
  assert.equal(clock.pending(), 0);
});
