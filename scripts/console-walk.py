"""Every one of 100,000 records, reached and acted on in the web console (headless Chromium).

Run by scripts/test-console after scripts/console-browser.py, with the same environment
(IDEMGATE_BIN, AXE_JS, SCREENSHOTS); it reuses that script's gateway, API and page checks.

The store is a fresh SQLite file that the idemgate binary creates (its schema at the current
version), filled with 100,000 rows in one transaction of inserts into its table (2 s; a loop
through the engine would take minutes): three tenants (acme and globex have tokens, initech
only records), four tools, creation times spread over three weeks with runs of seven records sharing one
millisecond (so that pages end inside a tie, which the cursor's tie-break must get right), and a
shuffled mix of states: completed, unknown, in flight with a lease that ran out (reported unknown),
in flight with a live lease, and expired (completed past the ttl, kept as a tombstone). The
gateway then opens the file; its records API (paged through to the end for both tenants with
tokens) must report every seeded record in its seeded state.

In the browser, signed in as the operator (every tenant):
- the unknown list (71 pages): "Next page" followed to the end; every unknown record exactly
  once, in the listing order, 100 a page, the counts shown true on every page (the console counts
  up to 10,000 and then says "10000 or more"), no next link on the last page (of 50 rows);
- the whole list (1,000 pages): the first ten pages followed, then pages all along it (every
  40th, the middle one and the last two) opened from their cursors and each one's link followed
  once; the same checks, and the next link names the cursor of its page's last record. Each page
  of the whole list costs the SQLite store a scan and sort of every record (it has no index on
  creation time), a third of a second here, so following all 1,000 takes six to seven minutes:
  WALK_ALL=1 does;
- no timestamp or key in the records table breaks across lines (a narrow window);
- search by an exact key (one row) and by a key prefix (every match, counted); the unknown
  records of one tool and of one tenant, counted;
- the newest unknown record (on the unknown list's last page) is opened from there and resolved
  ("it happened", with a result and a reason), and a completed record on the whole list's last
  page is reopened; the records API then shows the first completed with the operator's result
  and the second gone, and the unknown count shown drops by one;
- screenshots of the first, a middle and the last page, a search result and the resolved record
  (axe-core and the CSP checks of console-browser.py on each).
Prints how long seeding and each walk took.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

_spec = importlib.util.spec_from_file_location(
    "console_browser", Path(__file__).with_name("console-browser.py"))
assert _spec is not None and _spec.loader is not None
cb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cb)

RECORDS = 100_000
PAGE = 100
# The console counts up to this many and then says "N or more" (pages.rs, COUNT_UP_TO).
COUNT_UP_TO = 10_000
TENANTS = ("acme", "globex", "initech")
TOOLS = {"charge": "order", "invoice": "inv", "send_mail": "mail", "create_ticket": "ticket"}
# How many records of each state; the rest are completed. 7,050 unknown in all: 71 pages, the
# last one of 50.
PLANTED = {"unknown": 6_030, "lease_lost": 1_020, "in_flight": 50, "expired": 12_000}
TOKENS = {"acme": cb.ACME, "globex": cb.GLOBEX}
# The whole list, unless WALK_ALL=1: the first pages followed, then every SAMPLE_EVERY-th page
# opened from its cursor and its next link followed once (each page of the whole list costs the
# store a scan and sort of every record: about a third of a second here, so 1000 pages take six
# to seven minutes).
SAMPLE_FIRST = 10
SAMPLE_EVERY = 40
# A record as the listing orders it: creation time (ms), tenant, tool, key.
Row = tuple[int, str, str, str]
# Every page's rows, read at once: (tenant, tool, key, state) per row of the last table, the one
# the pages walk (the first page of the whole list has the unknown outcomes' table above it).
ROWS_JS = """() => {
  const tables = document.querySelectorAll('main table');
  if (!tables.length) return [];
  return Array.from(tables[tables.length - 1].querySelectorAll('tbody tr'), tr => {
    const c = tr.querySelectorAll('td');
    return [c[1].innerText, c[2].innerText, c[3].innerText, c[0].innerText];
  });
}"""
# Every timestamp and key in the records tables that the browser laid out on more than one line.
BROKEN_TIMES_JS = r"""() => {
  const broken = [];
  const stamp = /\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z/g;
  for (const td of document.querySelectorAll('main table td')) {
    const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.data.matchAll(stamp)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const lines = new Set(Array.from(range.getClientRects(), r => Math.round(r.top)));
        if (lines.size > 1) broken.push(m[0]);
      }
    }
  }
  for (const a of document.querySelectorAll('main table td a')) {
    if (a.getClientRects().length > 1) broken.push(a.innerText);
  }
  return broken;
}"""


def seed(db: Path) -> tuple[list[Row], dict[tuple[str, str, str], str]]:
    """Fills the store at `db` (its schema already made by idemgate). Returns its records in the
    listing order, and each one's state as the store must report it."""
    now = int(time.time() * 1000)
    start = now - 21 * 24 * 3_600_000
    step = (now - 3_600_000 - start) // (RECORDS // 7)
    states = [s for s, n in PLANTED.items() for _ in range(n)]
    states += ["completed"] * (RECORDS - len(states))
    random.Random(33).shuffle(states)
    tools = list(TOOLS.items())
    rows, seeded = [], []
    for i, state in enumerate(states):
        tenant = TENANTS[i % len(TENANTS)]
        tool, prefix = tools[(i // len(TENANTS)) % len(tools)]
        key = f"{prefix}-{i:06d}"
        created = start + (i // 7) * step
        fingerprint = hashlib.sha256(f"args-{i}".encode()).digest()
        token = hashlib.sha256(f"token-{i}".encode()).digest()[:16]
        scope = f"conversation:c-{i // 50}" if i % 3 else None
        lease = since = completed = expires = kind = body = retain = None
        if state == "unknown":
            db_state, since = 2, created + 30_000
        elif state in ("lease_lost", "in_flight"):
            # No boot-clock columns: the lease is judged by the wall clock, as a row written on
            # another boot is. One that ran out is reported unknown.
            db_state = 0
            lease = created + 30_000 if state == "lease_lost" else now + 6 * 3_600_000
        else:
            db_state, kind, completed = 1, 0, created + 500
            body = json.dumps({"content": "json", "result": {"n": i}}).encode()
            if state == "expired":
                expires, retain = now - 600_000, now + 7 * 24 * 3_600_000
            else:
                expires = retain = now + 30 * 24 * 3_600_000
        rows.append((tenant, tool, key, fingerprint, 1, token, created, db_state, lease, since,
                     completed, expires, kind, body, scope, retain))
        shown = "unknown" if state == "lease_lost" else state
        seeded.append((created, tenant, tool, key, shown))
    conn = sqlite3.connect(db)
    with conn:
        conn.executemany(
            "INSERT INTO idemgate_record (tenant, tool, key, fingerprint, fence, token, "
            "created_at, state, lease_until, since, completed_at, expires_at, outcome_kind, "
            "outcome_body, scope, retain_until) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    conn.close()
    # The listing order: creation time, then tenant, tool and key byte-wise.
    seeded.sort(key=lambda r: (r[0], r[1].encode(), r[2].encode(), r[3].encode()))
    return [r[:4] for r in seeded], {r[1:4]: r[4] for r in seeded}


def api_tally(base: str, tenant: str) -> Counter[str]:
    """Every record of `tenant` as the records API pages them: how many in each state."""
    tally: Counter[str] = Counter()
    cursor = ""
    while True:
        status, answer = cb.api(base, TOKENS[tenant], "GET",
                                f"/v1/records?limit=1000{'&cursor=' + cursor if cursor else ''}")
        assert status == 200, (status, answer)
        tally.update(r["state"] for r in answer["records"])
        if not answer["next"]:
            return tally
        cursor = answer["next"]


def summary(page: Page) -> str:
    return " ".join(page.locator("p.summary").inner_text().split())


def counted(n: int) -> str:
    return f"{COUNT_UP_TO} or more" if n >= COUNT_UP_TO else str(n)


def cursor_of(record: tuple[int, str, str, str]) -> str:
    """The console's cursor of the page after `record` (ListCursor's text: c1.<ms>.<hex>...)."""
    created, *names = record
    return "c1." + ".".join([str(created)] + [n.encode().hex() for n in names])


def check_page(page: Page, checks: cb.Checks, n: int, expected: list[Row], unknown: int,
               name: str) -> None:
    """Page `n` (from 0) of a listing of `expected` is showing: its rows, in order, and the
    counts; a screenshot of the first, middle and last."""
    pages = -(-len(expected) // PAGE)
    rows = [tuple(r[:3]) for r in page.evaluate(ROWS_JS)]
    want = [r[1:] for r in expected[n * PAGE:(n + 1) * PAGE]]
    assert rows == want, (name, n, rows[:3], want[:3])
    said = summary(page)
    assert said.startswith(f"{counted(unknown)} unknown of {counted(len(expected))} record(s)"), \
        (name, n, said)
    assert f"{len(rows)} shown on this page" in said, (name, n, said)
    next_link = page.locator('nav.pages a[rel="next"]')
    if n == pages - 1:
        assert next_link.count() == 0, (name, "a next link on the last page")
    else:
        href = next_link.get_attribute("href") or ""
        assert f"cursor={cursor_of(expected[(n + 1) * PAGE - 1])}" in href, (name, n, href)
    shot = {0: "first-page", pages // 2: "middle-page", pages - 1: "last-page"}.get(n)
    if shot:
        checks.page(page, f"walk-{name}-{shot}")


def follow(page: Page) -> None:
    """Clicks "Next page"."""
    with page.expect_navigation():
        page.locator('nav.pages a[rel="next"]').click()


def walk(page: Page, checks: cb.Checks, url: str, expected: list[Row], unknown: int,
         name: str) -> float:
    """Follows "Next page" from `url` to the end: every record of `expected` exactly once, in
    order, on pages of 100. Returns the seconds it took."""
    began = time.monotonic()
    page.goto(url)
    pages = -(-len(expected) // PAGE)
    for n in range(pages):
        check_page(page, checks, n, expected, unknown, name)
        if n < pages - 1:
            follow(page)
    return time.monotonic() - began


def sample(page: Page, checks: cb.Checks, base: str, expected: list[Row], unknown: int,
           name: str) -> tuple[float, int]:
    """Follows "Next page" over the first pages, then opens pages all along the listing from
    their cursors (as the previous page's link names them) and follows each one's link once,
    to the last page. Returns the seconds it took and how many pages it checked."""
    began = time.monotonic()
    pages = -(-len(expected) // PAGE)
    page.goto(base + "/ui")
    for n in range(SAMPLE_FIRST):
        check_page(page, checks, n, expected, unknown, name)
        follow(page)
    checked = SAMPLE_FIRST
    starts = sorted({*range(SAMPLE_FIRST, pages - 1, SAMPLE_EVERY), pages // 2 - 1, pages - 2})
    for n in starts:
        page.goto(base + "/ui?cursor=" + cursor_of(expected[n * PAGE - 1]))
        check_page(page, checks, n, expected, unknown, name)
        follow(page)
        check_page(page, checks, n + 1, expected, unknown, name)
        checked += 2
    return time.monotonic() - began, checked


def search(page: Page, base: str, key: str) -> list[list[str]]:
    page.goto(base + "/ui")
    page.get_by_label("Key starts with").fill(key)
    with page.expect_navigation():
        page.get_by_role("button", name="Filter").click()
    return page.evaluate(ROWS_JS)


def main() -> None:
    walk_all = os.environ.get("WALK_ALL") == "1"
    work = Path(tempfile.mkdtemp(prefix="idemgate-walk-"))
    db = work / "idemgate.db"
    timings: dict[str, float] = {}
    began = time.monotonic()
    # The binary makes the schema, at whatever version it writes.
    subprocess.run([cb.BIN, "--store", f"sqlite://{db}", "keys", "list"], check=True,
                   capture_output=True)
    everything, states = seed(db)
    timings["seed"] = time.monotonic() - began
    gateway, base = cb.start_gateway(work)
    try:
        unknowns = [r for r in everything if states[r[1:]] == "unknown"]
        began = time.monotonic()
        for tenant in TOKENS:
            want = Counter(s for r, s in states.items() if r[0] == tenant)
            got = api_tally(base, tenant)
            assert got == want, (tenant, got, want)
        timings["api"] = time.monotonic() - began

        checks = cb.Checks()
        checks.shots = 50  # after console-browser.py's screenshots, in the same directory
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                        args=cb.CHROMIUM_ARGS)
            ctx = browser.new_context(viewport={"width": 1280, "height": 800})
            page = ctx.new_page()
            checks.watch(page)
            cb.sign_in(page, checks, base, cb.OPERATOR, "walk-operator")

            timings["unknown"] = walk(page, checks, base + "/ui?state=unknown", unknowns,
                                      len(unknowns), "unknown")
            last_unknown = page.evaluate(ROWS_JS)

            # Timestamps and keys stay whole in a window narrower than the table wants.
            page.set_viewport_size({"width": 900, "height": 800})
            page.goto(base + "/ui")
            broken = page.evaluate(BROKEN_TIMES_JS)
            assert not broken, f"broken across lines: {broken[:5]}"
            checks.page(page, "walk-narrow-window")
            page.set_viewport_size({"width": 1280, "height": 800})

            if walk_all:
                timings["all"] = walk(page, checks, base + "/ui", everything, len(unknowns),
                                      "all")
                all_pages = f"all {-(-len(everything) // PAGE)} pages"
            else:
                timings["all"], checked = sample(page, checks, base, everything, len(unknowns),
                                                 "all")
                all_pages = f"{checked} of its pages (WALK_ALL=1 for every one)"
            last_all = page.evaluate(ROWS_JS)

            # Search: an exact key, then a prefix.
            _, tenant, tool, key = everything[len(everything) // 3]
            rows = search(page, base, key)
            assert [tuple(r[:3]) for r in rows] == [(tenant, tool, key)], rows
            prefix = "order-0999"
            matching = [r[1:] for r in everything if r[3].startswith(prefix)]
            rows = search(page, base, prefix)
            assert [tuple(r[:3]) for r in rows] == matching, (rows, matching)
            said = summary(page)
            assert f"of {len(matching)} record(s)" in said, said
            checks.page(page, "walk-search-prefix")
            for field, value in (("tool", "invoice"), ("tenant", "initech")):
                n = sum(1 for r in unknowns if r[2 if field == "tool" else 1] == value)
                page.goto(f"{base}/ui?state=unknown&{field}={value}")
                said = summary(page)
                assert said.startswith(f"{n} unknown of {n} record(s)"), (field, said)

            # Resolve the newest unknown record of a tenant with a token, found on the unknown
            # list's last page, and reopen a completed record from the whole list's last page.
            target = next(r for r in reversed(last_unknown) if r[0] in TOKENS)
            t_tenant, t_tool, t_key = target[:3]
            last = (len(unknowns) - 1) // PAGE * PAGE
            page.goto(base + "/ui?state=unknown&cursor=" + cursor_of(unknowns[last - 1]))
            with page.expect_navigation():
                page.get_by_role("link", name=t_key, exact=True).click()
            with page.expect_navigation():
                page.get_by_role("link", name="Resolve…").click()
            page.get_by_label("It happened").check()
            page.get_by_label("Result (JSON)").fill('{"walked": true}')
            page.get_by_label("Reason").fill("found on the last page of 71")
            with page.expect_navigation():
                page.get_by_role("button", name="Confirm resolution").click()
            assert "completed" in page.locator("dl.facts").inner_text()
            checks.page(page, "walk-resolved")
            status, rec = cb.api(base, TOKENS[t_tenant], "GET",
                                 f"/v1/tools/{t_tool}/records/{t_key}")
            assert status == 200 and rec["state"] == "completed", (status, rec)
            assert json.dumps(rec).find('"walked": true') >= 0, rec

            done = next(r for r in reversed(last_all) if r[0] in TOKENS and r[3] == "completed")
            d_tenant, d_tool, d_key = done[:3]
            page.goto(base + "/ui/record?" + "&".join(
                f"{k}={v}" for k, v in (("tenant", d_tenant), ("tool", d_tool), ("key", d_key))))
            with page.expect_navigation():
                page.get_by_role("link", name="Reopen…").click()
            page.get_by_label("Reason").fill("the customer asked again")
            with page.expect_navigation():
                page.get_by_role("button", name="Confirm reopening").click()
            status, rec = cb.api(base, TOKENS[d_tenant], "GET",
                                 f"/v1/tools/{d_tool}/records/{d_key}")
            assert status == 404, (status, rec)

            page.goto(base + "/ui?state=unknown")
            said = summary(page)
            assert said.startswith(f"{len(unknowns) - 1} unknown of {len(unknowns) - 1} "), said
            browser.close()
        total = sum(timings.values())
        print(f"console walk: ok ({len(everything)} records; {len(unknowns)} unknown in "
              f"{-(-len(unknowns) // PAGE)} pages, every one followed; the whole list: "
              f"{all_pages}; "
              + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
              + f"; {total:.0f} s before the rest)")
    finally:
        cb.stop_gateway(gateway, work)


if __name__ == "__main__":
    began = time.monotonic()
    main()
    print(f"console walk: {time.monotonic() - began:.0f} s in all")
    sys.exit(0)
