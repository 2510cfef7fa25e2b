// The token view of glassrl's report (glassrl.report.html): plain JS, no framework, no network.
// Data: <script type="application/json" id="token-data"> (html.token_payload). Each token is a span
// id="tok-B-I" data-b=B data-i=I coloured by the chosen quantity on a diverging scale centred at 0;
// clicking one fills #token-panel (every ledger field, id="field-NAME") and #token-legend (docs/token-convention.md: the
// lines glassrl.ledger.legend wrote for that token, id="legend-KEY"). A multi-turn response shows a tag per turn
// (id="turn-B-K"), its observation tokens hatched, and its per-turn credit under the tokens (id="turns-B").
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("token-data").textContent);
  if (!DATA.token_fields) return;  // a page without a token view (glassrl audit --html)
  const F = {};
  DATA.token_fields.forEach(function (name, k) { F[name] = k; });
  const SYM = DATA.symbols;
  const LABELS = {};
  DATA.quantities.forEach(function (q) { LABELS[q.field] = q.label; });
  const $ = function (id) { return document.getElementById(id); };
  const state = { source: DATA.initial.source, ledger: DATA.initial.ledger, quantity: null, selected: null };
  // RdBu end points and centre: negative blue, 0 near white, positive red.
  const INTEGER_FIELDS = ["index", "token_id", "response_index", "group_id", "length", "step", "turn",
    "policy_version", "staleness"];
  const PARAMETERS = ["gamma", "lam", "beta"];
  const LOW = [33, 102, 172], MID = [247, 247, 247], HIGH = [178, 24, 43];

  function isNum(x) { return typeof x === "number"; }
  // As glassrl.ledger.legend.fmt: 4 decimals, "—" for a missing quantity, -0.0000 shown as 0.0000.
  function fmt(x) {
    if (x === null || x === undefined) return "—";
    if (typeof x === "string") return x; // "nan", "inf", "-inf": not finite
    const t = x.toFixed(4);
    return t === "-0.0000" ? "0.0000" : t;
  }
  function num(x) { return x === null || x === undefined ? "—" : String(+Number(x).toPrecision(6)); }
  // Whitespace made visible where it would otherwise read as an empty box or break the line.
  function showTok(t) {
    if (t === "") return "∅";
    const shown = t.replace(/\n/g, "↵").replace(/\t/g, "⇥");
    return /^ +$/.test(shown) ? shown.replace(/ /g, "␣") : shown;
  }
  function quote(t) { return JSON.stringify(t); }
  function colour(t) {
    const end = t < 0 ? LOW : HIGH, u = Math.min(Math.abs(t), 1);
    return "rgb(" + MID.map(function (c, k) { return Math.round(c + (end[k] - c) * u); }).join(",") + ")";
  }
  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function ledger() { return DATA.sources[state.source].ledgers[state.ledger]; }
  function get(row, name) { return row[F[name]]; }

  // ------------------------------------------------------------------ controls

  function fillSelect(select, labels, value) {
    select.textContent = "";
    labels.forEach(function (label, k) { select.appendChild(el("option", { value: String(k) }, label)); });
    select.value = String(value);
  }
  function fillSteps() {
    const ledgers = DATA.sources[state.source].ledgers;
    fillSelect($("step-select"), ledgers.map(function (lg) { return lg.step === null ? "—" : String(lg.step); }),
      state.ledger);
    $("step-control").hidden = ledgers.length === 1 && ledgers[0].step === null;
    $("step-select").disabled = ledgers.length === 0;
  }
  function fillQuantities() {
    const lg = ledger();
    const have = DATA.quantities.filter(function (q) {
      return lg && lg.responses.some(function (r) {
        return r.tokens.some(function (row) { return isNum(get(row, q.field)); });
      });
    });
    if (!have.some(function (q) { return q.field === state.quantity; })) {
      state.quantity = have.length ? have[0].field : null;
    }
    const select = $("quantity-select");
    select.textContent = "";
    have.forEach(function (q) { select.appendChild(el("option", { value: q.field }, q.label)); });
    select.value = state.quantity || "";
  }

  // ------------------------------------------------------------------ drawing

  function runLine(lg) {
    const hasKl = lg.responses.some((r) => r.tokens.some((row) => isNum(get(row, "kl"))));
    const kl = lg.kl_kind ? "KL " + lg.kl_kind + " from log-probs" : hasKl ? "KL given per token" : "no KL";
    const parts = [`estimator ${lg.estimator}`, `γ = ${num(lg.gamma)}`, `λ = ${num(lg.lam)}`, `β = ${num(lg.beta)}`, kl];
    if (lg.step !== null) parts.unshift("step " + lg.step);
    return DATA.sources[state.source].name + ": " + parts.join(" · ");
  }
  function render() {
    const box = $("responses");
    box.textContent = "";
    state.selected = null;
    clearPanel();
    const lg = ledger();
    if (!lg) {
      $("run-line").textContent = DATA.sources[state.source].name + ": this run wrote no ledger " +
        "(logging.ledger_every = 0, or no ledger step reached yet).";
      return;
    }
    $("run-line").textContent = runLine(lg);
    const q = state.quantity;
    let m = 0;
    lg.responses.forEach(function (r) {
      r.tokens.forEach(function (row) {
        const v = q === null ? null : get(row, q);
        if (get(row, "response_mask") && isNum(v)) m = Math.max(m, Math.abs(v));
      });
    });
    $("colorbar-min").textContent = fmt(-m);
    $("colorbar-max").textContent = fmt(m);
    $("colorbar-label").textContent = q === null ? "no quantity to colour by" : LABELS[q] + " (0 at the centre)";
    lg.responses.forEach(function (r, b) { box.appendChild(drawResponse(r, b, q, m)); });
  }
  function drawResponse(r, b, q, m) {
    const div = el("div", { "class": "response", "data-b": String(b), id: "response-" + b });
    const head = el("div", { "class": "response-head" });
    head.appendChild(el("b", {}, "response " + b));
    const bits = ["score " + fmt(r.score), "group " + (r.group_id === null ? "—" : r.group_id), r.length + " tokens",
      "finish " + (r.finish_reason || "—")];
    if (r.turns) bits.push(r.turns.length + (r.turns.length === 1 ? " turn" : " turns"));
    if (r.baseline_reward !== null) bits.push("baseline reward " + fmt(r.baseline_reward));
    const flagged = (ledger().flagged || {})[String(b)];
    if (flagged) { div.classList.add("flagged"); bits.push("reward watch: " + flagged); }
    head.appendChild(document.createTextNode(" · " + bits.join(" · ")));
    div.appendChild(head);
    // s_0 exactly as the policy saw it (a ledger from before it has the rewards' text only)
    div.appendChild(el("div", { "class": "prompt" }, "prompt: " + (r.prompt_as_seen ?? r.prompt)));
    const line = el("div", { "class": "tokens" });
    const turnAt = {};  // first token of each turn -> its index (multi-turn responses)
    (r.turns || []).forEach(function (t, k) { turnAt[t.start] = k; });
    r.tokens.forEach(function (row, i) {
      const mask = get(row, "response_mask");
      const v = q === null ? null : get(row, q);
      if (turnAt[i] !== undefined) line.appendChild(turnTag(r.turns[turnAt[i]], b, turnAt[i]));
      const observation = isObservation(r, row);
      if (observation && (i === 0 || !isObservation(r, r.tokens[i - 1]))) {
        line.appendChild(el("span", { "class": "obs-tag" }, "tool/obs"));
      }
      const span = el("span", { "class": observation ? "tok obs" : "tok", id: "tok-" + b + "-" + i,
        "data-b": String(b), "data-i": String(i), tabindex: "0",
        "data-value": v === null ? "" : String(v) }, showTok(get(row, "token")));
      if (mask && isNum(v)) {
        const t = m > 0 ? v / m : 0;
        span.style.background = colour(t);
        if (Math.abs(t) > 0.65) span.style.color = "#fff";
      }
      line.appendChild(span);
    });
    div.appendChild(line);
    if (r.turn_legend && r.turn_legend.length) {
      // Credit per turn: glassrl.ledger.legend.turn_legend's lines, shown as written.
      div.appendChild(el("div", { "class": "turn-credit", id: "turns-" + b }, r.turn_legend.join("\n")));
    }
    return div;
  }
  // An observation token: its role says so in a multi-turn ledger; a given ledger marks it with mask 0.
  function isObservation(r, row) { return r.turns ? get(row, "role") === "observation" : !get(row, "response_mask"); }
  function turnTag(t, b, k) {
    const calls = t.tool_calls.map(function (c) { return c.name + ": " + c.status; }).join(", ");
    const title = "turn " + k + ": tokens " + t.start + "…" + (t.end - 1) + ", finish " + t.finish_reason +
      (calls ? "; calls " + calls : "");
    return el("span", { "class": "turn-tag", id: "turn-" + b + "-" + k, title: title },
      "turn " + k + " · " + t.finish_reason);
  }

  // ------------------------------------------------------------------ panel and legend

  function clearPanel() {
    $("panel-empty").hidden = false;
    $("panel-fields").textContent = "";
    $("token-legend").textContent = "";
  }
  function fieldRow(table, name, value) {
    const tr = el("tr");
    tr.appendChild(el("th", {}, (SYM[name] && SYM[name] !== name ? SYM[name] + "  " : "") + name));
    let text;
    if (value === null || value === undefined) text = "—";
    else if (typeof value === "boolean") text = value ? "True" : "False";
    else if (name === "token") text = quote(value);
    else if (INTEGER_FIELDS.indexOf(name) >= 0) text = String(value);
    else if (typeof value === "object") text = JSON.stringify(value); // a response's turns
    else if (PARAMETERS.indexOf(name) >= 0) text = num(value);
    else text = isNum(value) ? fmt(value) : String(value); // strings, and "nan" / "inf" as they are
    const raw = JSON.stringify(value === undefined ? null : value);
    tr.appendChild(el("td", { id: "field-" + name, "data-value": raw }, text));
    table.appendChild(tr);
  }
  function select(b, i) {
    const lg = ledger(), r = lg.responses[b], row = r.tokens[i];
    if (state.selected) {
      const old = $("tok-" + state.selected[0] + "-" + state.selected[1]);
      if (old) old.classList.remove("selected");
    }
    state.selected = [b, i];
    $("tok-" + b + "-" + i).classList.add("selected");
    $("panel-empty").hidden = true;
    const table = $("panel-fields");
    table.textContent = "";
    const group = (title) => {
      const tr = el("tr", { "class": "group" });
      tr.appendChild(el("th", { colspan: "2" }, title));
      table.appendChild(tr);
    };
    group("token");
    DATA.token_fields.forEach(function (name) { fieldRow(table, name, get(row, name)); });
    group("response");
    DATA.response_fields.forEach(function (name) { fieldRow(table, name, r[name]); });
    group("run");
    DATA.run_fields.forEach(function (name) { fieldRow(table, name, lg[name]); });
    // The legend is glassrl.ledger.legend's text, written in Python (html.token_payload): shown, not composed.
    const box = $("token-legend");
    box.textContent = "";
    if (lg.baselines.length) {
      const base = el("div", { id: "legend-baselines", "class": "baselines" });
      base.appendChild(el("div", {}, DATA.legend.baselines_heading));
      lg.baselines.forEach(function (line) { base.appendChild(el("div", {}, line)); });
      box.appendChild(base);
    }
    r.legend[i].forEach(function (line) {
      const div = el("div", { id: "legend-" + line[0] });
      div.appendChild(el("span", { "class": "tag" }, DATA.legend.labels[line[0]]));
      div.appendChild(document.createTextNode(line[1]));
      box.appendChild(div);
    });
  }
  // ------------------------------------------------------------------ tooltip and events

  function tooltip(span, ev) {
    const b = +span.dataset.b, i = +span.dataset.i, lg = ledger(), row = lg.responses[b].tokens[i];
    const lines = ["a_" + i + " = " + quote(get(row, "token")) + "   (response " + b + ", token " + i + ")"];
    if (get(row, "turn") !== null && get(row, "turn") !== undefined) lines.push("turn " + get(row, "turn"));
    if (get(row, "role") === "observation" || get(row, "role") === null && !get(row, "response_mask")) {
      lines.push("observation / tool token (mask False)");
    } else if (!get(row, "response_mask")) lines.push("generated, does not train (mask False)");
    if (state.quantity !== null) lines.push(LABELS[state.quantity] + " = " + fmt(get(row, state.quantity)));
    ["kl", "token_rewards", "values", "advantages", "returns"].forEach(function (n) {
      if (n !== state.quantity && get(row, n) !== null) lines.push(SYM[n] + " = " + fmt(get(row, n)));
    });
    lines.push("click to see every field");
    const tip = $("token-tooltip");
    tip.textContent = lines.join("\n");
    tip.hidden = false;
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 370) + "px";
    tip.style.top = (ev.clientY + 16) + "px";
  }
  function tokenOf(ev) { return ev.target.closest ? ev.target.closest(".tok[data-b]") : null; }

  const responses = $("responses");
  responses.addEventListener("mousemove", (ev) => {
    const s = tokenOf(ev);
    if (s) tooltip(s, ev); else $("token-tooltip").hidden = true;
  });
  responses.addEventListener("mouseleave", function () { $("token-tooltip").hidden = true; });
  responses.addEventListener("click", (ev) => {
    const s = tokenOf(ev);
    if (s) select(+s.dataset.b, +s.dataset.i);
  });
  responses.addEventListener("keydown", function (ev) {
    const s = tokenOf(ev);
    if (s && (ev.key === "Enter" || ev.key === " ")) { ev.preventDefault(); select(+s.dataset.b, +s.dataset.i); }
  });
  $("source-select").addEventListener("change", function (ev) {
    state.source = +ev.target.value;
    state.ledger = Math.max(DATA.sources[state.source].ledgers.length - 1, 0);
    fillSteps(); fillQuantities(); render();
  });
  $("step-select").addEventListener("change", (ev) => {
    state.ledger = +ev.target.value;
    fillQuantities();
    render();
  });
  $("quantity-select").addEventListener("change", function (ev) {
    const keep = state.selected;
    state.quantity = ev.target.value;
    render();
    if (keep) select(keep[0], keep[1]);
  });

  // the reward watch's links (report section #watch): open the alert's ledger and select its response
  document.querySelectorAll("a.alert-row").forEach(function (a) {
    a.addEventListener("click", function () {
      state.source = +a.dataset.source;
      const k = DATA.sources[state.source].ledgers.findIndex(function (lg) { return lg.step === +a.dataset.step; });
      if (k < 0) return;
      state.ledger = k;
      fillSelect($("source-select"), DATA.sources.map(function (s) { return s.name; }), state.source);
      fillSteps(); fillQuantities(); render();
      select(+a.dataset.b, 0);
    });
  });

  fillSelect($("source-select"), DATA.sources.map(function (s) { return s.name; }), state.source);
  $("source-control").hidden = DATA.sources.length === 1;
  fillSteps();
  fillQuantities();
  render();
})();
