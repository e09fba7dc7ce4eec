// Pieces shared by the pages: the run's tab bar (only the tabs the role may
// use) and a poller that refreshes a page without reloading it.
import { h, message } from '../dom.js';
import { api, role, seg, session } from '../api.js';

// GET /runs/{run}, one request per run for the pages and the tab bar
// rendered together (kept 2 s, so a change shows on the next page; a failed one is not kept).
const runCache = new Map();
export function runInfo(run) {
  const hit = runCache.get(run);
  if (hit && Date.now() - hit.at < 2000) return hit.p;
  const p = api.get(`/api/v1/runs/${seg(run)}`);
  runCache.set(run, { at: Date.now(), p });
  p.catch(() => runCache.delete(run));
  return p;
}

// The tab bar; runs with a mixture-of-experts layer (their config, which
// logged-in users may read, says model.type "dmoe") get an Experts tab,
// pipeline runs (a "pipeline" object in the config) a Pipeline tab.
const RUN_KIND_TABS = [
  ['/experts', 'Experts', (c) => c.model && c.model.type === 'dmoe'],
  ['/pipeline', 'Pipeline', (c) => c.pipeline !== null && typeof c.pipeline === 'object'],
];

export function runTabs(run, active) {
  const r = role();
  const tabs = [['', 'Overview'], ['/leaderboard', 'Leaderboard']];
  if (r === 'organizer') tabs.push(['/admin', 'Allowlist & peers']);
  if (r === 'organizer' || r === 'auditor') tabs.push(['/audit', 'Audit']);
  const tab = ([suffix, text]) => h('li', h('a', {
    href: `#/run/${encodeURIComponent(run)}${suffix}`,
    'aria-current': suffix === active ? 'page' : null,
  }, text));
  const ul = h('ul.tabs', tabs.map(tab));
  const here = RUN_KIND_TABS.find(([suffix]) => suffix === active);
  if (here) ul.insertBefore(tab(here), ul.children[2] || null);
  else if (session()) {
    runInfo(run).then((x) => {
      const c = (x && x.config) || {};
      for (const t of RUN_KIND_TABS) if (t[2](c) && ul.isConnected) ul.insertBefore(tab(t), ul.children[2] || null);
    }).catch(() => {});
  }
  return h('div.run-head',
    h('p.crumb', h('a', { href: '#/' }, 'Runs'), ' / '),
    h('h1', { id: 'run-name' }, run),
    ul);
}

// Calls fn now and every `ms` until the returned stop function runs. A
// failing refresh shows its error in `status` and polling goes on.
export function poll(fn, ms, status) {
  let stopped = false;
  let timer = null;
  const tick = async () => {
    if (stopped) return;
    try {
      await fn();
      if (status) status.textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (e) {
      if (status) status.textContent = `could not refresh: ${e.message}`;
    }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  return () => { stopped = true; clearTimeout(timer); };
}

// The page for a role that may not see it (the API would answer 403 anyway).
export function forbidden(main, what, who) {
  const r = role();
  main.appendChild(message('error', r === 'anonymous' ? `${what} needs you to log in.` : `${what} is for ${who}; you are ${r === 'auditor' ? 'an' : 'a'} ${r}.`));
  if (r === 'anonymous') main.appendChild(h('p', h('a', { href: '#/login' }, 'Log in')));
}

export function errorBox(e) {
  return message('error', e.status === 403 ? `Not allowed: ${e.message}` : e.message);
}
