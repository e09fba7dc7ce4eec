// Organizers: every run with its status (links to its allowlist, passes and
// peers), a form to create a run, and the accounts (create one).
import { h, table, fmtNum, fmtTime, message, fill } from '../dom.js';
import { api, role } from '../api.js';
import { forbidden, errorBox } from './common.js';

export function render(main) {
  if (role() !== 'organizer') { forbidden(main, 'Managing runs', 'organizers'); return null; }
  main.appendChild(h('h1', 'Manage runs'));
  const out = h('div', { id: 'admin-result', 'aria-live': 'polite' });
  const runsBox = h('section', { id: 'admin-runs' });
  const usersBox = h('section', { id: 'admin-users' });
  const say = (kind, text) => fill(out, message(kind, text));

  const rf = {
    name: h('input', { id: 'new-run-name', required: true, maxlength: 64, placeholder: 'name' }),
    batch: h('input', { id: 'new-run-batch', type: 'number', min: 1, required: true, placeholder: 'target batch size' }),
    model: h('input', { id: 'new-run-model', maxlength: 1024, placeholder: 'model summary' }),
    desc: h('input', { id: 'new-run-desc', maxlength: 4096, placeholder: 'description' }),
    config: h('textarea', { id: 'new-run-config', rows: 3, placeholder: 'config (JSON object, optional)' }),
  };
  const runForm = h('form.card', { id: 'new-run-form' }, h('h2', 'New run'), rf.name, rf.batch, rf.model, rf.desc, rf.config,
    h('button', { type: 'submit' }, 'Create run'));
  runForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const body = { name: rf.name.value.trim(), target_batch_size: Number(rf.batch.value) };
    if (rf.model.value.trim()) body.model_summary = rf.model.value.trim();
    if (rf.desc.value.trim()) body.description = rf.desc.value.trim();
    if (rf.config.value.trim()) {
      try { body.config = JSON.parse(rf.config.value); } catch (e) { say('error', `config is not JSON: ${e.message}`); return; }
    }
    try { await api.post('/api/v1/runs', body); say('ok', `run ${body.name} created`); runForm.reset(); await loadRuns(); } catch (e) { say('error', e.message); }
  });

  const uf = {
    name: h('input', { id: 'new-user-name', required: true, maxlength: 64, placeholder: 'username' }),
    role: h('select', { id: 'new-user-role' }, ['volunteer', 'auditor', 'organizer'].map((x) => h('option', { value: x }, x))),
    pw: h('input', { id: 'new-user-password', type: 'password', required: true, minlength: 8, placeholder: 'initial password', autocomplete: 'new-password' }),
  };
  const userForm = h('form.card', { id: 'new-user-form' }, h('h2', 'New account'), uf.name, uf.role, uf.pw, h('button', { type: 'submit' }, 'Create account'));
  userForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try {
      await api.post('/api/v1/users', { username: uf.name.value.trim(), role: uf.role.value, password: uf.pw.value });
      say('ok', `account ${uf.name.value.trim()} created`);
      userForm.reset();
      await loadUsers();
    } catch (e) { say('error', e.message); }
  });

  async function loadRuns() {
    const r = await api.get('/api/v1/runs');
    fill(runsBox, h('h2', 'Runs'), table(['run', 'status', 'model', 'target batch', 'created', ''],
      r.runs.map((x) => [h('a', { href: `#/run/${encodeURIComponent(x.name)}` }, x.name), h(`span.badge.${x.status}`, x.status),
        x.model_summary, fmtNum(x.target_batch_size), fmtTime(x.created_at),
        h('a', { href: `#/run/${encodeURIComponent(x.name)}/admin` }, 'allowlist & peers')]), 'no runs yet', { id: 'admin-runs-table' }));
  }
  async function loadUsers() {
    const u = await api.get('/api/v1/users');
    fill(usersBox, h('h2', 'Accounts'), table(['username', 'role', 'login', 'created', ''],
      u.users.map((x) => [h('span.user', x.username), x.role, x.login, fmtTime(x.created_at), x.disabled ? 'disabled' : '']),
      'none', { id: 'admin-users-table' }));
  }
  main.append(out, h('div.grid2', runForm, userForm), runsBox, usersBox);
  Promise.all([loadRuns(), loadUsers()]).catch((e) => fill(out, errorBox(e)));
  return null;
}
