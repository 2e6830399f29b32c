// scalemb interactive map: a canvas scatter of up to ~1e6 points, drawn point by point into an ImageData buffer
// (one 32-bit write per pixel of a point), edges as one translucent canvas path underneath.  The data come from
// the page's <script id="map-data" type="application/json">: typed arrays base64-encoded, little-endian.
"use strict";
(function () {
  const meta = JSON.parse(document.getElementById("map-data").textContent);
  const TYPES = {f32: Float32Array, f64: Float64Array, i32: Int32Array, u32: Uint32Array, u16: Uint16Array,
                 u8: Uint8Array};
  function decode(entry) {
    if (!entry) return null;
    const bin = atob(entry.b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new TYPES[entry.dtype](bytes.buffer);
  }
  const n = meta.n;
  const X = decode(meta.x), Y = decode(meta.y), ids = meta.id_names || decode(meta.ids);
  const values = {};
  for (const key of Object.keys(meta.values)) values[key] = decode(meta.values[key]);
  const edges = decode(meta.edges);
  const classes = decode(meta.classes), classNames = meta.class_names || [];
  const component = decode(meta.component);

  const canvas = document.getElementById("map"), ctx = canvas.getContext("2d");
  const tip = document.getElementById("tip"), info = document.getElementById("info");
  const legend = document.getElementById("legend");
  const layer = document.createElement("canvas"), lctx = layer.getContext("2d");
  let image = null, pixels = null;
  const view = {cx: 0, cy: 0, scale: 1};  // data units -> CSS pixels: px = (x - cx) * scale + width / 2
  let width = 0, height = 0, dpr = 1, found = -1, pending = false;

  // ---- colours: one packed RGBA (little-endian ABGR) per point and colour key
  function rgba(r, g, b) { return (255 << 24 | b << 16 | g << 8 | r) >>> 0; }
  function ramp(stops, t) {
    t = Math.min(1, Math.max(0, t)) * (stops.length - 1);
    const k = Math.min(stops.length - 2, Math.floor(t)), f = t - k, a = stops[k], b = stops[k + 1];
    return [a[0] + f * (b[0] - a[0]), a[1] + f * (b[1] - a[1]), a[2] + f * (b[2] - a[2])].map(Math.round);
  }
  const RDBU = [[33, 102, 172], [103, 169, 207], [209, 229, 240], [247, 247, 247], [253, 219, 199],
                [239, 138, 98], [178, 24, 43]];
  const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const TAB = [[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40], [148, 103, 189], [140, 86, 75],
               [227, 119, 194], [127, 127, 127], [188, 189, 34], [23, 190, 207], [174, 199, 232], [255, 187, 120],
               [152, 223, 138], [255, 152, 150], [197, 176, 213], [196, 156, 148], [247, 182, 210],
               [199, 199, 199], [219, 219, 141], [158, 218, 229]];
  const keys = {};
  function colourKey(name) {
    if (keys[name]) return keys[name];
    const colours = new Uint32Array(n), order = new Uint32Array(n);
    for (let i = 0; i < n; i++) order[i] = i;
    let legendHtml = "";
    if (name === "time") {
      const t = values.time; let bound = 1e-12;
      for (let i = 0; i < n; i++) bound = Math.max(bound, Math.abs(t[i]));
      for (let i = 0; i < n; i++) colours[i] = rgba(...ramp(RDBU, 0.5 + 0.5 * t[i] / bound));
      order.sort((a, b) => Math.abs(t[a]) - Math.abs(t[b]));
      legendHtml = gradient(RDBU, (-bound).toPrecision(3), bound.toPrecision(3), "time 1");
    } else if (name === "degree") {
      const d = values.degree; let top = 1;
      for (let i = 0; i < n; i++) top = Math.max(top, d[i]);
      const lt = Math.log(Math.max(top, 2));
      for (let i = 0; i < n; i++) colours[i] = rgba(...ramp(VIRIDIS, Math.log(Math.max(d[i], 1)) / lt));
      order.sort((a, b) => d[a] - d[b]);
      legendHtml = gradient(VIRIDIS, "1", String(top), "degree (log)");
    } else if (name === "label") {
      for (let i = 0; i < n; i++) colours[i] = rgba(...TAB[classes[i] % TAB.length]);
      legendHtml = classNames.slice(0, 20).map((c, k) =>
        `<span class=sw style="background:rgb(${TAB[k % TAB.length]})"></span>${escapeHtml(c)}`).join("<br>");
    } else if (name === "component") {
      for (let i = 0; i < n; i++) colours[i] = component[i] === 0 ? rgba(31, 119, 180) : rgba(120, 120, 120);
      legendHtml = `<span class=sw style="background:rgb(31,119,180)"></span>largest component<br>` +
                   `<span class=sw style="background:rgb(120,120,120)"></span>other components`;
    } else {
      colours.fill(rgba(31, 119, 180));
    }
    keys[name] = {colours, order, legendHtml};
    return keys[name];
  }
  function gradient(stops, lo, hi, label) {
    const css = stops.map((s, k) => `rgb(${s}) ${(100 * k / (stops.length - 1)).toFixed(0)}%`).join(",");
    return `${label}<div class=bar style="background:linear-gradient(to right,${css})"></div>` +
           `<span>${lo}</span><span style="float:right">${hi}</span>`;
  }
  function escapeHtml(s) {
    return String(s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
  }

  // ---- spatial grid for hover: counting sort of the points into G x G cells over the data bounds
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (let i = 0; i < n; i++) {
    x0 = Math.min(x0, X[i]); x1 = Math.max(x1, X[i]); y0 = Math.min(y0, Y[i]); y1 = Math.max(y1, Y[i]);
  }
  const G = Math.max(1, Math.min(1024, Math.round(Math.sqrt(n / 4))));
  const cw = Math.max((x1 - x0) / G, 1e-12), ch = Math.max((y1 - y0) / G, 1e-12);
  const cellOf = new Uint32Array(n), start = new Uint32Array(G * G + 1), items = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    const gx = Math.min(G - 1, Math.floor((X[i] - x0) / cw)), gy = Math.min(G - 1, Math.floor((Y[i] - y0) / ch));
    cellOf[i] = gy * G + gx; start[cellOf[i] + 1]++;
  }
  for (let c = 0; c < G * G; c++) start[c + 1] += start[c];
  const fill = start.slice(0, G * G);
  for (let i = 0; i < n; i++) items[fill[cellOf[i]]++] = i;

  function nearest(px, py, radius) {
    const dx = px, dy = py, r = radius / view.scale;
    const gx0 = Math.max(0, Math.floor((dx - r - x0) / cw)), gx1 = Math.min(G - 1, Math.floor((dx + r - x0) / cw));
    const gy0 = Math.max(0, Math.floor((dy - r - y0) / ch)), gy1 = Math.min(G - 1, Math.floor((dy + r - y0) / ch));
    if ((gx1 - gx0 + 1) * (gy1 - gy0 + 1) > 4096) return -1;  // zoomed far out: no hover
    let best = -1, bestD = r * r;
    for (let gy = gy0; gy <= gy1; gy++) for (let gx = gx0; gx <= gx1; gx++) {
      const c = gy * G + gx;
      for (let k = start[c]; k < start[c + 1]; k++) {
        const i = items[k], ex = X[i] - dx, ey = Y[i] - dy, d = ex * ex + ey * ey;
        if (d <= bestD) { bestD = d; best = i; }
      }
    }
    return best;
  }

  // ---- view and drawing
  function toScreen(x, y) { return [(x - view.cx) * view.scale + width / 2, height / 2 - (y - view.cy) * view.scale]; }
  function toData(px, py) { return [(px - width / 2) / view.scale + view.cx, (height / 2 - py) / view.scale + view.cy]; }
  function fit(b) {
    view.cx = (b[0] + b[1]) / 2; view.cy = (b[2] + b[3]) / 2;
    view.scale = Math.min(width / Math.max(b[1] - b[0], 1e-12), height / Math.max(b[3] - b[2], 1e-12));
  }
  function resize() {
    dpr = window.devicePixelRatio || 1;
    width = canvas.clientWidth; height = canvas.clientHeight;
    canvas.width = Math.round(width * dpr); canvas.height = Math.round(height * dpr);
    layer.width = canvas.width; layer.height = canvas.height;
    image = lctx.createImageData(layer.width, layer.height);
    pixels = new Uint32Array(image.data.buffer);
  }
  function request() { if (!pending) { pending = true; requestAnimationFrame(draw); } }
  // while the view moves, many edges are left out (one frame stays well under 50 ms); they return 200 ms later
  let moved = -Infinity, idle = null;
  function moving() { moved = performance.now(); clearTimeout(idle); idle = setTimeout(request, 200); request(); }
  const pointSide = n > 300000 ? 1 : n > 30000 ? 2 : 3;
  function draw() {
    pending = false;
    const W = canvas.width, H = canvas.height, s = view.scale * dpr;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    const hurry = edges && edges.length > 40000 && performance.now() - moved < 180;
    if (edges && !hurry && document.getElementById("edges").checked) {
      const m = edges.length / 2, alpha = Math.min(0.5, Math.max(0.04, 25 / Math.sqrt(m)));
      ctx.strokeStyle = `rgba(60,60,60,${alpha})`; ctx.lineWidth = Math.max(0.5, 0.6 * dpr);
      ctx.beginPath();
      for (let e = 0; e < 2 * m; e += 2) {
        const a = edges[e], b = edges[e + 1];
        ctx.moveTo((X[a] - view.cx) * s + W / 2, H / 2 - (Y[a] - view.cy) * s);
        ctx.lineTo((X[b] - view.cx) * s + W / 2, H / 2 - (Y[b] - view.cy) * s);
      }
      ctx.stroke();
    }
    const key = colourKey(document.getElementById("colour").value);
    pixels.fill(0);
    const side = Math.max(1, Math.round(Math.min(6, pointSide + Math.max(0, Math.log2(view.scale / base.scale))) * dpr));
    const half = side >> 1, colours = key.colours, order = key.order;
    const ox = W / 2 - view.cx * s - half + 0.5, oy = H / 2 + view.cy * s - half + 0.5;  // + 0.5: floor rounds
    if (side === 1) {  // the 1e6-point case: one store per point
      for (let k = 0; k < n; k++) {
        const i = order[k], px = Math.floor(X[i] * s + ox), py = Math.floor(oy - Y[i] * s);
        if (px >= 0 && py >= 0 && px < W && py < H) pixels[py * W + px] = colours[i];
      }
    } else {
      for (let k = 0; k < n; k++) {
        const i = order[k], px = Math.floor(X[i] * s + ox), py = Math.floor(oy - Y[i] * s);
        if (px <= -side || py <= -side || px >= W || py >= H) continue;
        const c = colours[i], u1 = Math.min(W, px + side), v1 = Math.min(H, py + side), u0 = Math.max(0, px);
        for (let v = Math.max(0, py); v < v1; v++) {
          const row = v * W;
          for (let u = u0; u < u1; u++) pixels[row + u] = c;
        }
      }
    }
    lctx.putImageData(image, 0, 0);
    ctx.drawImage(layer, 0, 0);
    if (found >= 0) {
      const [fx, fy] = toScreen(X[found], Y[found]);
      ctx.strokeStyle = "#d62728"; ctx.lineWidth = 2 * dpr;
      ctx.beginPath(); ctx.arc(fx * dpr, fy * dpr, 9 * dpr, 0, 2 * Math.PI); ctx.stroke();
    }
    legend.innerHTML = document.getElementById("legend-on").checked ? key.legendHtml : "";
    document.body.dataset.frames = String(Number(document.body.dataset.frames || 0) + 1);
  }

  function describe(i) {
    const rows = [["node", String(ids[i])]];
    if (values.degree) rows.push(["degree", String(values.degree[i])]);
    if (values.time) rows.push(["time 1", values.time[i].toFixed(3)]);
    if (values.np) rows.push(["NP@deg", Number.isNaN(values.np[i]) ? "-" : values.np[i].toFixed(3)]);
    if (classes) rows.push(["label", classNames[classes[i]]]);
    if (component) rows.push(["component", `${component[i] + 1} of ${meta.n_components} (${meta.component_sizes[component[i]]} nodes)`]);
    return rows.map(([k, v]) => `<b>${k}</b> ${escapeHtml(v)}`).join("<br>");
  }

  // ---- interaction: drag to pan, wheel to zoom about the cursor, hover for a node, find by id
  let drag = null;
  canvas.addEventListener("pointerdown", e => { drag = {x: e.clientX, y: e.clientY, cx: view.cx, cy: view.cy};
                                                canvas.setPointerCapture(e.pointerId); });
  canvas.addEventListener("pointerup", () => { drag = null; });
  canvas.addEventListener("pointermove", e => {
    const r = canvas.getBoundingClientRect(), px = e.clientX - r.left, py = e.clientY - r.top;
    if (drag) {
      view.cx = drag.cx - (e.clientX - drag.x) / view.scale; view.cy = drag.cy + (e.clientY - drag.y) / view.scale;
      tip.style.display = "none"; moving(); return;
    }
    const [dx, dy] = toData(px, py), i = nearest(dx, dy, 8);
    if (i < 0) { tip.style.display = "none"; return; }
    tip.innerHTML = describe(i); tip.style.display = "block";
    tip.style.left = `${px + 14}px`; tip.style.top = `${py + 14}px`;
    tip.dataset.index = String(i);
  });
  canvas.addEventListener("pointerleave", () => { tip.style.display = "none"; });
  canvas.addEventListener("wheel", e => {
    e.preventDefault();
    const r = canvas.getBoundingClientRect(), px = e.clientX - r.left, py = e.clientY - r.top;
    const [ax, ay] = toData(px, py), f = Math.exp(-e.deltaY * (e.deltaMode === 1 ? 0.05 : 0.0015));
    view.scale *= f;
    view.cx = ax - (px - width / 2) / view.scale; view.cy = ay + (py - height / 2) / view.scale;
    moving();
  }, {passive: false});
  function find(text) {
    const want = meta.id_names ? text.trim() : Number(text.trim());
    found = -1;
    if (text.trim() !== "" && (meta.id_names || Number.isFinite(want))) {
      for (let i = 0; i < n; i++) if (ids[i] === want) { found = i; break; }
    }
    if (found < 0) { info.innerHTML = `no node with id ${escapeHtml(text)}`; request(); return -1; }
    view.cx = X[found]; view.cy = Y[found]; view.scale = Math.max(view.scale, 4 * base.scale);
    info.innerHTML = describe(found); request(); return found;
  }
  document.getElementById("find").addEventListener("submit", e => {
    e.preventDefault(); find(document.getElementById("node").value);
  });
  for (const id of ["edges", "colour", "legend-on"]) document.getElementById(id).addEventListener("change", request);
  document.getElementById("reset").addEventListener("click", () => { fit(meta.frame); request(); });
  document.getElementById("all").addEventListener("click", () => { fit([x0, x1, y0, y1]); request(); });
  window.addEventListener("resize", () => { resize(); request(); });

  resize();
  fit(meta.frame);
  const base = {scale: view.scale};
  draw();
  window.scalembMap = {n, view, toScreen, find, nearest, draw, ready: true};
  document.body.dataset.ready = "1";
})();
