// Crowdtrain dashboard: a small single-page app served by the coordinator.
// Hash routes (no server-side routing needed):
//   #/                      runs
//   #/login                 log in (same sessions as the API)
//   #/run/NAME              run overview: live loss curve, peers, throughput, ETA
//   #/run/NAME/leaderboard  verified contributions per user
//   #/run/NAME/experts      dmoe runs: who serves each expert, its checkpoints
//   #/run/NAME/pipeline     pipeline runs: devices x stages, step times, throughput
//   #/run/NAME/admin        organizers: allowlist, passes, peers and roles
//   #/run/NAME/audit        organizers, auditors: contributions, filters, CSV
//   #/me                    the logged-in user's devices, sessions, contribution
//   #/admin                 organizers: runs (create, open/pause/finish)
//   #/audit-log             organizers, auditors: the audit log
// Pages show only what the role may do; the API enforces it regardless.
import './style.css';
import { h, clear } from './dom.js';
import { session, logout, setUnauthorizedHandler } from './api.js';
import * as runs from './pages/runs.js';
import * as loginPage from './pages/login.js';
import * as overview from './pages/overview.js';
import * as leaderboard from './pages/leaderboard.js';
import * as experts from './pages/experts.js';
import * as pipeline from './pages/pipeline.js';
import * as runAdmin from './pages/run_admin.js';
import * as audit from './pages/audit.js';
import * as me from './pages/me.js';
import * as admin from './pages/admin.js';
import * as auditLog from './pages/audit_log.js';

const ROUTES = [
  [/^\/?$/, runs],
  [/^\/login$/, loginPage],
  [/^\/run\/([^/]+)$/, overview],
  [/^\/run\/([^/]+)\/leaderboard$/, leaderboard],
  [/^\/run\/([^/]+)\/experts$/, experts],
  [/^\/run\/([^/]+)\/pipeline$/, pipeline],
  [/^\/run\/([^/]+)\/admin$/, runAdmin],
  [/^\/run\/([^/]+)\/audit$/, audit],
  [/^\/me$/, me],
  [/^\/admin$/, admin],
  [/^\/audit-log$/, auditLog],
];

let cleanup = null;

function nav() {
  const s = session();
  const role = s ? s.role : 'anonymous';
  const links = [['#/', 'Runs']];
  if (s) links.push(['#/me', 'My contribution']);
  if (role === 'organizer') links.push(['#/admin', 'Manage runs']);
  if (role === 'organizer' || role === 'auditor') links.push(['#/audit-log', 'Audit log']);
  const here = location.hash || '#/';
  return h('nav.top',
    h('a.brand', { href: '#/' }, 'Crowdtrain'),
    h('ul', links.map(([href, text]) => h('li', h('a', { href, 'aria-current': here === href ? 'page' : null }, text)))),
    h('div.who', s
      ? [h('span', { id: 'who' }, s.username), h('span.role', s.role),
        h('button.link', { id: 'logout', onclick: async () => { await logout(); location.hash = '#/'; route(); } }, 'Log out')]
      : h('a', { href: '#/login', id: 'login-link' }, 'Log in')));
}

export function route() {
  if (cleanup) { try { cleanup(); } catch (e) { console.error(e); } cleanup = null; }
  const path = decodeURIComponent((location.hash || '#/').slice(1));
  const app = clear(document.getElementById('app'));
  app.appendChild(nav());
  const main = h('main', { id: 'page' });
  app.appendChild(main);
  for (const [re, page] of ROUTES) {
    const m = path.match(re);
    if (m) {
      cleanup = page.render(main, m.slice(1)) || null;
      return;
    }
  }
  main.appendChild(h('h1', 'Not found'));
  main.appendChild(h('p', 'No page at this address. ', h('a', { href: '#/' }, 'Back to the runs')));
}

setUnauthorizedHandler(() => {
  if (!location.hash.startsWith('#/login')) location.hash = '#/login';
});
window.addEventListener('hashchange', route);
route();
