// Log in with a username and password (POST /api/v1/session).
import { h, message, fill } from '../dom.js';
import { login } from '../api.js';

export function render(main) {
  const user = h('input', { id: 'username', name: 'username', autocomplete: 'username', required: true, maxlength: 64 });
  const pass = h('input', { id: 'password', name: 'password', type: 'password', autocomplete: 'current-password', required: true });
  const out = h('div', { id: 'login-result' });
  const form = h('form.card.narrow', { id: 'login-form' },
    h('h1', 'Log in'),
    h('label', { for: 'username' }, 'Username'), user,
    h('label', { for: 'password' }, 'Password'), pass,
    h('button', { type: 'submit' }, 'Log in'), out);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    fill(out, message('info', 'logging in…'));
    try {
      await login(user.value.trim(), pass.value);
      location.hash = '#/me';
    } catch (e) {
      fill(out, message('error', e.message));
    }
  });
  main.appendChild(form);
  user.focus();
}
