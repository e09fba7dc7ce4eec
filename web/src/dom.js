// DOM helpers. Every piece of text from the API goes in through textContent
// (or an attribute set with setAttribute on a fixed name): nothing here
// parses a string as HTML, so a '<script>' in a run description or a revoke
// reason shows as those characters. The coordinator's Content-Security-Policy
// is the second line of defence.

// h('div.card', {onclick: fn, title: 'x'}, child, 'text', [more children])
export function h(tag, attrs, ...children) {
  const [name, ...classes] = tag.split('.');
  const el = document.createElement(name || 'div');
  if (classes.length) el.className = classes.join(' ');
  if (attrs && (typeof attrs !== 'object' || attrs instanceof Node || Array.isArray(attrs))) {
    children.unshift(attrs);
    attrs = null;
  }
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'value') el.value = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

// A table from rows of plain values or nodes; empty rows show `empty`.
export function table(headers, rows, empty = 'nothing yet', attrs = {}) {
  return h('table', attrs,
    h('thead', h('tr', headers.map((t) => h('th', t)))),
    h('tbody', rows.length
      ? rows.map((r) => h('tr', r.map((c) => h('td', c))))
      : h('tr', h('td.empty', { colspan: headers.length }, empty))));
}

export function fmtTime(unix) {
  if (!unix) return '—';
  return new Date(unix * 1000).toISOString().replace('T', ' ').slice(0, 19) + ' UTC';
}

export function fmtNum(x, digits = 0) {
  if (x === undefined || x === null || !Number.isFinite(Number(x))) return '—';
  return Number(x).toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}

export function fmtDuration(s) {
  if (s === undefined || s === null || !Number.isFinite(s) || s < 0) return '—';
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} days`;
}

export function shortKey(k) {
  return k && k.length > 14 ? `${k.slice(0, 8)}…${k.slice(-4)}` : (k || '');
}

export function message(kind, text) {
  return h(`p.msg.${kind}`, { role: kind === 'error' ? 'alert' : 'status' }, text);
}

// Replaces el's children (skipping null/false, like h); Element.replaceChildren
// would turn a null into the text "null".
export function fill(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}
