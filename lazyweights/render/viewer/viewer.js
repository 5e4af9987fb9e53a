// The lazyweights plan viewer: interaction for the inline SVG that lazyweights/render/visualize.py draws.
// Data: <script id="plan-data"> holds {panes: [{title, scenes: {grouped|full: {nodeId: details}}}], first, diff}.
// One pane for a plan, two side by side for a diff (Plan.diff(...).to_html()). Offline: no network, no library.
(function () {
  'use strict';
  const DATA = JSON.parse(document.getElementById('plan-data').textContent);
  const tip = document.getElementById('tip');
  const panel = document.getElementById('info');
  const search = document.getElementById('search');
  const hits = document.getElementById('hits');
  const toggle = document.getElementById('grouped');
  const MIN_K = 0.05, MAX_K = 8, READABLE_K = 0.7;

  function esc(s) {
    return String(s).replace(/[&<>"']/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c]));
  }
  const panes = Array.from(document.querySelectorAll('.pane')).map((el, i) => ({
    el: el, i: i, canvas: el.querySelector('.canvas'), data: DATA.panes[i], views: {}
  }));

  function sceneKey() { return toggle ? (toggle.checked ? 'grouped' : 'full') : DATA.first; }
  function det(p, id) { const s = p.data.scenes[sceneKey()]; return s ? s[id] : undefined; }

  // --- zoom and pan: a translate/scale transform on each scene's <g class="viewport"> ---
  function view(p) {
    const key = sceneKey();
    let v = p.views[key];
    if (!v) {
      const scene = p.canvas.querySelector('.scene[data-scene="' + key + '"]');
      const svg = scene.querySelector('svg');
      v = p.views[key] = {scene: scene, svg: svg, vp: svg.querySelector('.viewport'),
                          w: +svg.dataset.w, h: +svg.dataset.h, k: 1, x: 0, y: 0};
      fit(p, v);
    }
    return v;
  }
  function apply(v) {
    v.vp.setAttribute('transform', 'translate(' + v.x.toFixed(2) + ',' + v.y.toFixed(2) + ') scale(' + v.k.toFixed(5) + ')');
  }
  function fit(p, v) {
    v = v || view(p);
    const r = p.canvas.getBoundingClientRect(), pad = 12;
    const W = Math.max(50, r.width - 2 * pad), H = Math.max(50, r.height - 2 * pad);
    let k = Math.min(W / v.w, H / v.h, 1.5);
    // A tall plan fitted whole is unreadable: fit its width (or a readable scale) and show its top.
    if (k < READABLE_K) k = Math.min(1, Math.max(READABLE_K, W / v.w));
    v.k = k; v.x = pad; v.y = pad;
    // Too wide for the pane: a diff shows the outputs' side (where the differences are marked).
    if (DATA.diff && v.w * k > W) v.x = pad + W - v.w * k;
    apply(v);
  }
  function zoomAt(p, f, cx, cy) {
    const v = view(p), r = p.canvas.getBoundingClientRect();
    const px = (cx === undefined ? r.width / 2 : cx - r.left), py = (cy === undefined ? r.height / 2 : cy - r.top);
    const k = Math.max(MIN_K, Math.min(MAX_K, v.k * f));
    const g = k / v.k;
    v.x = px - (px - v.x) * g; v.y = py - (py - v.y) * g; v.k = k;
    apply(v);
  }
  function centerOn(p, el) {
    const v = view(p), b = el.getBBox(), r = p.canvas.getBoundingClientRect();
    const sx = b.x * v.k + v.x, sy = b.y * v.k + v.y;
    // Move only along an axis where the element is out of sight, so the rest of the view stays put.
    if (sx < 0 || sx + b.width * v.k > r.width) v.x = r.width / 2 - (b.x + b.width / 2) * v.k;
    if (sy < 0 || sy + b.height * v.k > r.height) v.y = r.height / 2 - (b.y + b.height / 2) * v.k;
    apply(v);
  }

  let drag = null;
  panes.forEach(p => {
    p.canvas.addEventListener('wheel', e => {
      e.preventDefault();
      zoomAt(p, Math.exp(-e.deltaY * 0.0015), e.clientX, e.clientY);
    }, {passive: false});
    p.canvas.addEventListener('mousedown', e => {
      if (e.button !== 0) return;
      const v = view(p);
      drag = {p: p, x: e.clientX, y: e.clientY, vx: v.x, vy: v.y, moved: false};
      p.canvas.classList.add('dragging');
    });
    p.canvas.addEventListener('mouseover', e => hover(p, e));
    p.canvas.addEventListener('mousemove', e => moveTip(e));
    p.canvas.addEventListener('mouseout', e => unhover(p, e));
    p.canvas.addEventListener('mouseleave', () => { tip.style.display = 'none'; });
    p.canvas.addEventListener('click', e => {
      if (drag && drag.moved) return;
      const g = e.target.closest && e.target.closest('.node');
      if (g) select(p, g.dataset.id); else clearSelection();
    });
    p.canvas.addEventListener('keydown', e => {
      const g = e.target.closest && e.target.closest('.node');
      if (g && (e.key === 'Enter' || e.key === ' ')) { select(p, g.dataset.id); e.preventDefault(); }
    });
  });
  window.addEventListener('mousemove', e => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
    if (drag.moved) { const v = view(drag.p); v.x = drag.vx + dx; v.y = drag.vy + dy; apply(v); tip.style.display = 'none'; }
  });
  window.addEventListener('mouseup', () => {
    if (!drag) return;
    const d = drag;
    d.p.canvas.classList.remove('dragging');
    setTimeout(() => { if (drag === d) drag = null; }, 0);
  });
  window.addEventListener('keydown', e => {
    if (e.target === search) return;
    const p = panes[0];
    if (e.key === '+' || e.key === '=') panes.forEach(q => zoomAt(q, 1.25));
    else if (e.key === '-') panes.forEach(q => zoomAt(q, 0.8));
    else if (e.key === '0') panes.forEach(q => fit(q));
    else if (e.key === 'Escape' && p) clearSelection();
  });
  document.getElementById('zoom-in').addEventListener('click', () => panes.forEach(q => zoomAt(q, 1.25)));
  document.getElementById('zoom-out').addEventListener('click', () => panes.forEach(q => zoomAt(q, 0.8)));
  document.getElementById('fit').addEventListener('click', () => panes.forEach(q => fit(q)));

  // --- hover: the node, its edges, and a tooltip ---
  function nodeEl(p, id) { return view(p).svg.querySelector('.node[data-id="' + id + '"]'); }
  function edgesOf(p, id) {
    return view(p).svg.querySelectorAll('.edge[data-from="' + id + '"],.edge[data-to="' + id + '"]');
  }
  function hover(p, e) {
    const g = e.target.closest && e.target.closest('.node');
    if (!g || (drag && drag.moved)) return;
    g.classList.add('hov');
    edgesOf(p, g.dataset.id).forEach(el => el.classList.add('hov'));
    const d = det(p, g.dataset.id);
    if (!d) return;
    tip.innerHTML = '<b>' + esc(d.title) + '</b><br><code>' + esc(d.line) + '</code>';
    tip.style.display = 'block';
    moveTip(e);
  }
  function unhover(p, e) {
    const g = e.target.closest && e.target.closest('.node');
    if (!g || (e.relatedTarget && g.contains(e.relatedTarget))) return;
    g.classList.remove('hov');
    edgesOf(p, g.dataset.id).forEach(el => el.classList.remove('hov'));
    tip.style.display = 'none';
  }
  function moveTip(e) {
    if (tip.style.display !== 'block') return;
    const x = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    const y = Math.min(e.clientY + 14, window.innerHeight - tip.offsetHeight - 8);
    tip.style.left = x + 'px'; tip.style.top = y + 'px';
  }

  // --- selection: highlight what a node depends on and what uses it; details in the side panel ---
  function closure(p, id, dir, acc) {
    acc = acc || new Set();
    if (acc.has(id)) return acc;
    acc.add(id);
    const d = det(p, id);
    if (d) d[dir].forEach(n => closure(p, n, dir, acc));
    return acc;
  }
  function clearMarks() {
    panes.forEach(p => view(p).svg.querySelectorAll('.dim,.sel,.hit').forEach(el => el.classList.remove('dim', 'sel', 'hit')));
  }
  function highlight(p, ids) {
    const svg = view(p).svg;
    svg.querySelectorAll('.node').forEach(g => { if (!ids.has(g.dataset.id)) g.classList.add('dim'); });
    svg.querySelectorAll('.edge').forEach(e => { if (!(ids.has(e.dataset.from) && ids.has(e.dataset.to))) e.classList.add('dim'); });
    svg.querySelectorAll('.box').forEach(b => b.classList.add('dim'));
  }
  function rowsHtml(rows) {
    return '<table>' + rows.map(r => '<tr><td>' + esc(r[0]) + '</td><td>' + esc(r[1]) + '</td></tr>').join('') + '</table>';
  }
  function detailsHtml(p, id, d) {
    let h = '<h2>' + esc(d.title) + (panes.length > 1 ? ' <span class="note">(' + esc(p.data.title) + ')</span>' : '') + '</h2>';
    h += '<div class="line"><code>' + esc(d.line) + '</code></div>' + rowsHtml(d.rows);
    if (d.chain && d.chain.length) {
      h += '<h3>chain (inputs first)</h3><ol class="chain">' + d.chain.map(c =>
        '<li><a class="go" data-pane="' + p.i + '" data-id="' + esc(c[0]) + '"><code>' + esc(c[1]) + '</code></a>' +
        (c[2] ? '<br><span class="note">' + esc(c[2]) + '</span>' : '') + '</li>').join('') + '</ol>';
    }
    if (d.diff && d.diff.length) {
      h += '<h3>differences</h3>' + d.diff.map(l => '<pre class="diffline ' +
        (l[0] === '-' ? 'minus' : (l[0] === '+' ? 'plus' : '')) + '">' + esc(l) + '</pre>').join('');
    }
    h += '<p class="note">Highlighted: everything this node depends on and everything that uses it. ' +
      'Click empty space (or Esc) to clear.</p>';
    return h;
  }
  function select(p, id) {
    clearMarks();
    const d = det(p, id);
    if (!d) return;
    highlight(p, new Set([...closure(p, id, 'preds'), ...closure(p, id, 'succs')]));
    const el = nodeEl(p, id);
    if (el) { el.classList.add('sel'); centerOn(p, el); }
    if (DATA.diff && d.names) {  // the same output in the other plan: outlined and brought into view too
      panes.forEach(q => {
        const other = q === p ? null : findOutput(q, d.names[0]);
        const e2 = other && nodeEl(q, other);
        if (e2) { e2.classList.add('sel'); centerOn(q, e2); }
      });
    }
    panel.innerHTML = detailsHtml(p, id, d);
    panel.dataset.selected = p.i + ':' + id;
  }
  function clearSelection() {
    clearMarks();
    showHelp();
    if (search.value.trim()) runSearch();
  }
  function showHelp() {
    panel.innerHTML = document.getElementById('help').innerHTML;
    delete panel.dataset.selected;
  }
  function findOutput(p, name) {
    const scene = p.data.scenes[sceneKey()];
    for (const id in scene) if (scene[id].names && scene[id].names.indexOf(name) >= 0) return id;
    return null;
  }
  // Links in the panel: a chain entry (pane + node id) or a diff list entry (an output name).
  panel.addEventListener('click', e => {
    const a = e.target.closest && e.target.closest('a.go');
    if (!a) return;
    if (a.dataset.id) { select(panes[+a.dataset.pane], a.dataset.id); return; }
    for (const p of panes) {
      const id = findOutput(p, a.dataset.name);
      if (id) { select(p, id); return; }
    }
  });

  // --- search: output names and stored tensor names (a glob with * and ?, or a substring) ---
  function matcher(q) {
    try {
      if (q.includes('*') || q.includes('?')) {
        return new RegExp('^' + q.replace(/[.+^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*').replace(/\?/g, '.') + '$');
      }
      return new RegExp(q.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
    } catch (err) { return null; }
  }
  function runSearch() {
    clearMarks();
    const q = search.value.trim();
    if (!q) { hits.textContent = ''; return; }
    const re = matcher(q);
    if (!re) { hits.textContent = 'not a pattern'; return; }
    let total = 0, first = null;
    panes.forEach(p => {
      const scene = p.data.scenes[sceneKey()], ids = new Set();
      for (const id in scene) if (scene[id].search.split(' ').some(s => re.test(s))) ids.add(id);
      total += ids.size;
      const all = new Set();
      ids.forEach(id => closure(p, id, 'preds', all));
      highlight(p, all);
      ids.forEach(id => {
        const el = nodeEl(p, id);
        if (el) { el.classList.add('hit'); if (!first) first = [p, el]; }
      });
    });
    if (first) centerOn(first[0], first[1]);
    hits.textContent = total ? total + ' match' + (total > 1 ? 'es' : '') : 'no match';
  }
  search.addEventListener('input', runSearch);

  // --- grouped (repeated layers drawn once) and ungrouped views ---
  function showScene() {
    const key = sceneKey();
    panes.forEach(p => {
      p.canvas.querySelectorAll('.scene').forEach(s => { s.hidden = s.dataset.scene !== key; });
      view(p);
    });
    showHelp();
    runSearch();
  }
  if (toggle) toggle.addEventListener('change', showScene);

  panes.forEach(p => view(p));
  showHelp();
  // plan.html#select=n21, #search=layers.*.q_proj*, #full: shareable links (also used for screenshots)
  const h = new URLSearchParams(location.hash.slice(1));
  if (h.get('full') !== null && toggle) { toggle.checked = false; showScene(); }
  if (h.get('zoom')) panes.forEach(p => zoomAt(p, +h.get('zoom') || 1, p.canvas.getBoundingClientRect().left, p.canvas.getBoundingClientRect().top));
  if (h.get('search')) { search.value = h.get('search'); runSearch(); }
  if (h.get('select') && panes.length && det(panes[0], h.get('select'))) select(panes[0], h.get('select'));
  document.body.dataset.ready = '1';
})();
