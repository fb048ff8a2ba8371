// The conversations list in the sidebar: grouped by day (Today, Yesterday, a weekday in the last
// week, then dates) with each conversation's time, relative while it is recent ("5 min ago").
// The server renders the list flat, each entry with a `<time datetime>` of its creation; days
// are the reader's own (the browser's time zone), so the grouping is done here, again after
// every swap of the list and once a minute for the relative times.

const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const WEEKDAYS = ['Sunday', 'Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday'];
const MINUTE = 60_000;
const HOUR = 60 * MINUTE;

/** Local midnight of `date`, as a number of days, to compare calendar days. */
function dayNumber(date) {
  return Math.round(new Date(date.getFullYear(), date.getMonth(), date.getDate()).getTime() / (24 * HOUR));
}

function clock(date) {
  return `${String(date.getHours()).padStart(2, '0')}:${String(date.getMinutes()).padStart(2, '0')}`;
}

/**
 * The heading of the day `date` falls on, seen from `now`: "Today", "Yesterday", a weekday
 * within the last week, else "12 Nov" (with the year when it is not this year's).
 *
 * @param {Date} date
 * @param {Date} now
 */
export function dayLabel(date, now) {
  const daysAgo = dayNumber(now) - dayNumber(date);
  if (daysAgo <= 0) return 'Today';
  if (daysAgo === 1) return 'Yesterday';
  if (daysAgo < 7) return WEEKDAYS[date.getDay()];
  const day = `${date.getDate()} ${MONTHS[date.getMonth()]}`;
  return date.getFullYear() === now.getFullYear() ? day : `${day} ${date.getFullYear()}`;
}

/**
 * When, for an entry under its day's heading: "just now", "5 min ago", "3 h ago" today, the
 * clock time ("14:05") on any other day.
 *
 * @param {Date} date
 * @param {Date} now
 */
export function relativeTime(date, now) {
  const ago = now.getTime() - date.getTime();
  if (dayNumber(now) !== dayNumber(date)) return clock(date);
  if (ago < MINUTE) return 'just now'; // a server clock slightly ahead included
  if (ago < HOUR) return `${Math.floor(ago / MINUTE)} min ago`;
  return `${Math.floor(ago / HOUR)} h ago`;
}

/**
 * Group the entries of the list (`<li>` with a `<time datetime>`, newest first) under a heading
 * per day and write each entry's time. Run it again at will: old headings are replaced.
 *
 * @param {HTMLElement | null} list the `.session-list`
 * @param {{now?: Date, document?: Document}} [options]
 */
export function groupSessionList(list, { now = new Date(), document = globalThis.document } = {}) {
  if (!list) return;
  list.querySelectorAll(':scope > .session-day').forEach((heading) => heading.remove());
  let current = null;
  for (const item of [...list.querySelectorAll(':scope > li')]) {
    const time = item.querySelector('time[datetime]');
    const date = time ? new Date(time.getAttribute('datetime')) : null;
    if (!date || Number.isNaN(date.getTime())) continue;
    time.textContent = relativeTime(date, now);
    time.title = `${dayLabel(date, now)}, ${clock(date)}`;
    const label = dayLabel(date, now);
    if (label === current) continue;
    current = label;
    const heading = document.createElement('li');
    heading.className = 'session-day';
    heading.setAttribute('role', 'presentation');
    heading.textContent = label;
    item.before(heading);
  }
}
