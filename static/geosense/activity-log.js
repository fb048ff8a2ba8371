// A turn's activity log: built live from the turn's events (live-turn.js), and rendered by
// the server from what is stored (templates/chat/activity_log.html: the turn's client-tool
// calls, with their outcomes). When a turn is rendered again, the live log stays (it holds
// what is not stored: backend calls, the model's thinking) and takes the stored entries in
// place of its live ones, matched by call id.

/** An empty log. */
export function activityLogElement(document) {
  const details = document.createElement('details');
  details.className = 'activity-log';
  details.dataset.testid = 'activity-log';
  const summary = document.createElement('summary');
  summary.textContent = 'Activity';
  details.append(summary, document.createElement('ol'));
  return details;
}

/** The log's summary says how many steps it holds; returns that number. */
export function countSteps(details) {
  const count = details.querySelectorAll('li').length;
  details.querySelector('summary').textContent = `Activity (${count} step${count === 1 ? '' : 's'})`;
  return count;
}

/** The entry of a call in `details`, if it has one. */
export function entryOfCall(details, callId) {
  return [...details.querySelectorAll('li[data-call-id]')].find((li) => li.dataset.callId === callId) ?? null;
}

/** Put the stored log's entries into the live one: in place of the same call's, or at the end. */
export function mergeStoredLog(live, stored) {
  for (const item of stored.querySelectorAll('li[data-call-id]')) {
    const same = entryOfCall(live, item.dataset.callId);
    if (same) same.replaceWith(item);
    else live.querySelector('ol').append(item);
  }
  countSteps(live);
}
