// Organizers and auditors: the audit log (GET /api/v1/audit), newest first.
import { h, table, fmtTime, fill } from '../dom.js';
import { api, role } from '../api.js';
import { forbidden, errorBox } from './common.js';

export function render(main) {
  const r = role();
  if (r !== 'auditor' && r !== 'organizer') { forbidden(main, 'The audit log', 'auditors and organizers'); return null; }
  main.appendChild(h('h1', 'Audit log'));
  const box = h('div', { id: 'audit-log' }, 'loading…');
  main.appendChild(box);
  api.get('/api/v1/audit?limit=500').then((a) => {
    fill(box, table(['#', 'time', 'who', 'action', 'target', 'details', 'from'],
      a.entries.map((e) => [String(e.id), fmtTime(e.at), e.actor, h('code', e.action), e.target,
        Object.keys(e.details || {}).length ? h('code.details', JSON.stringify(e.details)) : '', e.client_ip]),
      'no entries', { id: 'audit-log-table' }));
  }).catch((e) => fill(box, errorBox(e)));
  return null;
}
