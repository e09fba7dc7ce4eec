// Organizers: a run's status, allowlist (add, remove), access passes
// (revoke, with a reason), and the peers of the current averaging schedule
// with the role the solver gave each (computes and/or aggregates, its part
// of the gradient). Every change goes through the API, which audits it.
import { h, table, fmtNum, fmtTime, shortKey, message, fill } from '../dom.js';
import { api, seg, role } from '../api.js';
import { runTabs, forbidden, errorBox } from './common.js';

// How the others reach a live peer (docs/p2p.md): the coordinator's
// dial-back says direct, client or relayed; "punched" counts the peers it
// reaches, or that reach it, through a hole punched in their NATs.
function reachText(p) {
  if (!p.reachability) return p.accepts_inbound ? 'accepts inbound' : 'client mode';
  const base = p.reachability === 'client' ? 'client (not reachable)'
    : p.reachability === 'relayed' ? `relayed via ${p.relay || '?'}` : p.reachability;
  if (!p.punched) return base;
  const n = `${p.punched} peer${p.punched === 1 ? '' : 's'}`;
  return p.reachability === 'relayed' ? `hole-punched with ${n}, else ${base}` : `${base}; hole-punched with ${n}`;
}

export function render(main, [run]) {
  main.appendChild(runTabs(run, '/admin'));
  if (role() !== 'organizer') { forbidden(main, 'Managing a run', 'organizers'); return null; }
  const R = `/api/v1/runs/${seg(run)}`;
  const out = h('div', { id: 'admin-result', 'aria-live': 'polite' });
  const statusBox = h('section', { id: 'run-settings' });
  const allowBox = h('section', { id: 'allowlist' });
  const passBox = h('section', { id: 'passes' });
  const peerBox = h('section', { id: 'peers' });
  main.append(out, statusBox, allowBox, passBox, peerBox);
  const say = (kind, text) => fill(out, message(kind, text));
  let keyOwner = new Map();

  async function loadRun() {
    const r = await api.get(R);
    const sel = h('select', { id: 'run-status-select' },
      ['open', 'paused', 'finished'].map((s) => h('option', { value: s, selected: s === r.status }, s)));
    fill(statusBox, h('h2', 'Run'),
      h('p', 'Status ', sel, ' ', h('button', {
        id: 'run-status-save',
        onclick: async () => {
          try { await api.patch(R, { status: sel.value }); say('ok', `run ${run} is now ${sel.value}`); } catch (e) { say('error', e.message); }
        },
      }, 'Save')),
      r.description ? h('p.desc', r.description) : null);
  }

  async function loadAllow() {
    const a = await api.get(`${R}/allowlist`);
    const input = h('input', { id: 'allow-username', placeholder: 'username', maxlength: 64, pattern: '[A-Za-z0-9_][A-Za-z0-9_.\\-]{0,63}', required: true });
    const form = h('form.inline', { id: 'allow-form' }, input, h('button', { type: 'submit', id: 'allow-add' }, 'Add to allowlist'));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const u = input.value.trim();
      try {
        const r = await api.put(`${R}/allowlist/${seg(u)}`);
        say('ok', r.added ? `${u} added to the allowlist` : `${u} was already on the allowlist`);
        await loadAllow();
      } catch (e) { say('error', e.message); }
    });
    fill(allowBox, h('h2', `Allowlist (${a.allowlist.length})`), form,
      table(['username', 'added', 'account', ''], a.allowlist.map((x) => [
        h('span.user', x.username), fmtTime(x.added_at), x.has_account ? 'yes' : 'not yet',
        h('button.danger', {
          'data-user': x.username,
          onclick: async () => {
            try {
              const r = await api.del(`${R}/allowlist/${seg(x.username)}`);
              say('ok', `${x.username} removed; ${r.passes_revoked} pass(es) revoked`);
              await Promise.all([loadAllow(), loadPasses()]);
            } catch (e) { say('error', e.message); }
          },
        }, 'Remove'),
      ]), 'nobody yet', { id: 'allowlist-table' }));
  }

  async function loadPasses() {
    const p = await api.get(`${R}/passes?state=all`);
    keyOwner = new Map(p.passes.map((x) => [x.peer_public_key, x.username]));
    const now = Date.now() / 1000;
    fill(passBox, h('h2', 'Access passes'),
      table(['pass', 'username', 'peer key', 'issued', 'expires', 'state', ''], p.passes.map((x) => {
        const state = x.revoked_at ? 'revoked' : x.expires_at > now ? 'active' : 'expired';
        let action = x.revoked_at ? h('span.reason', x.revoke_reason) : null;
        if (state === 'active') {
          const reason = h('input', { placeholder: 'reason', maxlength: 512, 'data-reason': x.pass_id });
          action = h('span.inline', reason, h('button.danger', {
            'data-revoke': x.pass_id,
            onclick: async () => {
              try {
                const body = reason.value.trim() ? { reason: reason.value.trim() } : {};
                await api.post(`${R}/passes/${seg(x.pass_id)}/revoke`, body);
                say('ok', `pass ${x.pass_id} of ${x.username} revoked, with its device key (no new pass for it until released)`);
                await loadPasses();
              } catch (e) { say('error', e.message); }
            },
          }, 'Revoke'));
        }
        return [x.pass_id, x.username, h('code', { title: x.peer_public_key }, shortKey(x.peer_public_key)),
          fmtTime(x.issued_at), fmtTime(x.expires_at), h(`span.badge.${state}`, state), action];
      }), 'no passes issued', { id: 'passes-table' }));
  }

  async function loadPeers() {
    const parts = [h('h2', 'Peers and their roles (current schedule)')];
    try {
      const s = await api.get(`${R}/schedule`);
      const sch = s.schedule || {};
      const peers = sch.peers || [];
      parts.push(h('p', `version ${s.version} · valid until ${fmtTime(s.valid_until)} · group size ${sch.group_size ?? '—'} · solved in ${fmtNum(s.solve_ms, 1)} ms`));
      parts.push(table(['peer key', 'username', 'role', 'aggregates (part of the gradient)', 'connections'], peers.map((p) => {
        const share = (p.share || 0) / 1e9;
        const roleName = p.compute && share > 0 ? 'computes + aggregates' : p.compute ? 'computes' : share > 0 ? 'aggregates only' : 'idle';
        return [h('code', { title: p.key }, shortKey(p.key)), keyOwner.get(p.key) || '?', h('span.role-name', roleName),
          share > 0 ? `${(100 * share).toFixed(1)} %` : '—', p.client_mode ? 'client mode (outbound only)' : 'accepts inbound'];
      }), 'no peers in the schedule', { id: 'peers-table' }));
    } catch (e) {
      parts.push(e.code === 'no_peers' || e.code === 'run_not_schedulable' ? message('info', e.message) : errorBox(e));
    }
    // live peers from their capability reports: how the others reach each
    // one (the coordinator's dial-back, docs/p2p.md "Reachability"), its
    // measured link, and whether its rounds average anything
    try {
      const lp = await api.get(`${R}/peers`);
      parts.push(h('h3', 'Live peers'), table(['peer key', 'username', 'reachability', 'address', 'upload / download', 'samples/s', 'averaging'],
        lp.peers.map((p) => [h('code', { title: p.peer_public_key }, shortKey(p.peer_public_key)), p.username,
          h('span.reach', reachText(p)),
          p.address || '—', `${fmtNum(p.upload_mbps, 1)} / ${fmtNum(p.download_mbps, 1)} Mbit/s`, fmtNum(p.samples_per_s, 1),
          p.failing_rounds ? h('span.failing', { title: p.failing_reason || '' }, `${fmtNum(p.failing_rounds)} rounds averaged nothing`) : 'ok']),
        'no live peers', { id: 'live-peers-table' }));
    } catch (e) { parts.push(errorBox(e)); }
    try {
      const hist = await api.get(`${R}/schedules`);
      parts.push(h('h3', 'Schedule history'), table(['version', 'created', 'peers', 'group size', 'steps/s', 'solve'],
        hist.schedules.slice(0, 20).map((x) => [String(x.version), fmtTime(x.created_at), String(x.peers), String(x.group_size),
          fmtNum(x.steps_per_s, 3), `${fmtNum(x.solve_ms, 1)} ms`]), 'none yet', { id: 'schedules-table' }));
    } catch (e) { parts.push(errorBox(e)); }
    fill(peerBox, ...parts);
  }

  (async () => {
    try {
      await Promise.all([loadRun(), loadAllow(), loadPasses()]);
      await loadPeers();
    } catch (e) { fill(out, errorBox(e)); }
  })();
  return null;
}
