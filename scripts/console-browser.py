"""The web console in a real headless browser (Debian's chromium, driven by Playwright).

Run by scripts/test-console, which installs the pinned tools and passes:
  IDEMGATE_BIN      the idemgate binary
  AXE_JS            axe-core's axe.min.js, run in every page the test visits
  SCREENSHOTS       the directory the screenshots go to
  DOCS_SCREENSHOT   optional: where to write the screenshot the docs show (docs/console.png)

It starts `idemgate serve` (SQLite store, audit log, two tenants and an operator token), makes
an unknown record through the gateway's HTTP API, and checks, in the browser: sign-in, the unknown
record first, its timeline, that another tenant can neither see nor resolve it (also by posting
the form directly with its own session and CSRF token), that a post without the CSRF token is
refused, the operator's view of both tenants, resolving with a reason, the charts, the CSP header
on every page and no CSP violation, and no axe-core violation on any page. Then a retried call
through the gateway gets the resolution, and a tool in observe mode (shadow mode) runs its
duplicate, which the records page's "observed" filter and the record's timeline show.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from playwright.sync_api import Page, Response, sync_playwright

BIN = os.environ["IDEMGATE_BIN"]
AXE = Path(os.environ["AXE_JS"]).read_text()
SHOTS = Path(os.environ["SCREENSHOTS"])
DOCS_SHOT = os.environ.get("DOCS_SCREENSHOT")

ACME = "acme-token-0123456789abcdef"
GLOBEX = "globex-token-0123456789abcdef"
OPERATOR = "operator-token-0123456789abcdef"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def token_hash(token: str) -> str:
    return subprocess.run(
        [BIN, "token", "hash", token], check=True, capture_output=True, text=True
    ).stdout.strip()


def start_gateway(work: Path) -> tuple[subprocess.Popen[str], str]:
    config = work / "gateway.toml"
    config.write_text(
        f"""
[server]
listen = "127.0.0.1:0"
store = "sqlite://{work}/idemgate.db"
audit_log = "{work}/audit.jsonl"

[[tenants]]
id = "acme"
token_sha256 = "{token_hash(ACME)}"

[[tenants]]
id = "globex"
token_sha256 = "{token_hash(GLOBEX)}"

# Shadow mode for one tool: its duplicates run, and the console lists what enforce would have done.
[tools.mail]
mode = "observe"

[console]
operator_token_sha256 = "{token_hash(OPERATOR)}"
"""
    )
    proc = subprocess.Popen(
        [BIN, "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=open(work / "gateway.log", "w"),
        text=True,
    )
    assert proc.stdout is not None
    # The first stdout line says where it listens (port 0 picked a free one); readline waits for it.
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise SystemExit(f"the gateway did not start: {line!r}\n{(work / 'gateway.log').read_text()}")
    return proc, line.split("listening on ", 1)[1].strip()


def stop_gateway(proc: subprocess.Popen[str], work: Path) -> None:
    """Stops the gateway `start_gateway` started and removes its directory."""
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    shutil.rmtree(work, ignore_errors=True)


def api(base: str, token: str, method: str, path: str, body: object | None = None,
        key: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(base + path, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        req.add_header("Content-Type", "application/json")
    if key is not None:
        req.add_header("Idempotency-Key", key)
    try:
        with urllib.request.urlopen(req, data, timeout=30) as res:
            return res.status, json.loads(res.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def make_records(base: str) -> None:
    # acme: a charge whose outcome is unknown (the caller reports an ambiguous outcome).
    status, begun = api(base, ACME, "POST", "/v1/tools/charge/begin", {"amount": 42}, "order-42")
    assert status == 201, (status, begun)
    status, amb = api(base, ACME, "POST", "/v1/tools/charge/ambiguous",
                      {"key": "order-42", "lease": begun["lease"], "reason": "timed out after sending"})
    assert status == 200 and amb["decision"] == "unknown", (status, amb)
    # A retry now is refused as unknown; one with other arguments is refused as a reused key.
    status, p = api(base, ACME, "POST", "/v1/tools/charge/begin", {"amount": 42}, "order-42")
    assert status == 409 and p["type"].endswith("outcome-unknown"), (status, p)
    status, p = api(base, ACME, "POST", "/v1/tools/charge/begin", {"amount": 43}, "order-42")
    assert status == 422, (status, p)
    # globex: a completed invoice, replayed once.
    status, begun = api(base, GLOBEX, "POST", "/v1/tools/invoice/begin", {"n": 7}, "invoice-7")
    assert status == 201, (status, begun)
    status, done = api(base, GLOBEX, "POST", "/v1/tools/invoice/complete",
                       {"key": "invoice-7", "lease": begun["lease"],
                        "outcome": {"kind": "success", "result": {"invoice": 7}}})
    assert status == 200, (status, done)
    status, replay = api(base, GLOBEX, "POST", "/v1/tools/invoice/begin", {"n": 7}, "invoice-7")
    assert status == 200 and replay["decision"] == "replayed", (status, replay)


class Checks:
    """Per-page checks: the CSP header, no CSP violation, no axe-core violation; a screenshot."""

    def __init__(self) -> None:
        self.shots = 0
        self.csp_errors: list[str] = []

    def watch(self, page: Page) -> None:
        page.on("console", lambda m: self.csp_errors.append(m.text)
                if "Content Security Policy" in m.text else None)

    def page(self, page: Page, name: str, res: Response | None = None) -> None:
        if res is not None:
            csp = res.headers.get("content-security-policy", "")
            assert "default-src 'none'" in csp and "script-src 'self'" in csp, (name, csp)
        # Evaluated through the DevTools protocol, which the page's CSP does not govern: the
        # page itself still runs no inline script.
        page.evaluate(AXE + "\n;undefined")
        result = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
        violations = result["violations"]
        assert not violations, f"axe-core on {name}: " + json.dumps(
            [{"id": v["id"], "help": v["help"], "nodes": [n["html"] for n in v["nodes"]]}
             for v in violations], indent=1)
        self.shots += 1
        page.screenshot(path=str(SHOTS / f"{self.shots:02d}-{name}.png"), full_page=True)
        assert not self.csp_errors, f"CSP violations on {name}: {self.csp_errors}"


def sign_in(page: Page, checks: Checks, base: str, token: str, who: str) -> None:
    res = page.goto(base + "/ui")
    assert page.url.endswith("/ui/login"), page.url
    checks.page(page, f"{who}-sign-in", res)
    page.get_by_label("Token").fill(token)
    with page.expect_navigation():
        page.get_by_role("button", name="Sign in").click()
    assert page.url.endswith("/ui"), page.url


def record_state(base: str) -> str:
    status, rec = api(base, ACME, "GET", "/v1/tools/charge/records/order-42")
    assert status == 200, (status, rec)
    return rec["state"]


def main() -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("*.png"):
        old.unlink()
    work = Path(tempfile.mkdtemp(prefix="idemgate-console-"))
    gateway, base = start_gateway(work)
    try:
        make_records(base)
        checks = Checks()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            record_path = "/ui/record?tenant=acme&tool=charge&key=order-42"
            resolve_path = "/ui/resolve?tenant=acme&tool=charge&key=order-42"

            # The operator sees the unknown outcome first, in a table of its own, then both
            # tenants' records, oldest first.
            op_ctx = browser.new_context(viewport={"width": 1280, "height": 720})
            op = op_ctx.new_page()
            checks.watch(op)
            sign_in(op, checks, base, OPERATOR, "operator")
            stuck, everything = op.locator("table").nth(0), op.locator("table").nth(1)
            assert "Unknown outcomes" in stuck.locator("caption").inner_text()
            unknown_rows = stuck.locator("tbody tr")
            assert unknown_rows.count() == 1, unknown_rows.all_inner_texts()
            assert "order-42" in unknown_rows.nth(0).inner_text()
            rows = everything.locator("tbody tr")
            assert rows.count() == 2, rows.all_inner_texts()
            assert "order-42" in rows.nth(0).inner_text() and "unknown" in rows.nth(0).inner_text()
            assert "invoice-7" in rows.nth(1).inner_text()
            checks.page(op, "operator-records")
            if DOCS_SHOT:
                op.screenshot(path=DOCS_SHOT)
            op.get_by_label("Tenant").fill("globex")
            with op.expect_navigation():
                op.get_by_role("button", name="Filter").click()
            assert "order-42" not in op.content() and "invoice-7" in op.content()

            # globex can neither see nor resolve acme's record.
            gx_ctx = browser.new_context()
            gx = gx_ctx.new_page()
            checks.watch(gx)
            sign_in(gx, checks, base, GLOBEX, "globex")
            assert "order-42" not in gx.content() and "invoice-7" in gx.content()
            checks.page(gx, "globex-records")
            for path in (record_path, resolve_path):
                res = gx.goto(base + path)
                assert res is not None and res.status == 404, (path, res and res.status)
            checks.page(gx, "globex-not-found", res)
            gx.goto(base + "/ui")
            gx_csrf = gx.locator('input[name="csrf"]').first.get_attribute("value")
            assert gx_csrf
            form = {"tenant": "acme", "tool": "charge", "key": "order-42", "fence": "1",
                    "resolution": "release", "reason": "not mine"}
            res = gx_ctx.request.post(base + "/ui/resolve", form={**form, "csrf": gx_csrf})
            assert res.status == 404, res.status
            res = gx_ctx.request.post(base + "/ui/resolve", form=form)
            assert res.status == 403, res.status
            assert record_state(base) == "unknown"

            # acme signs in, finds the unknown record and its timeline.
            ctx = browser.new_context(viewport={"width": 1280, "height": 720})
            page = ctx.new_page()
            checks.watch(page)
            sign_in(page, checks, base, ACME, "acme")
            first = page.locator("tbody tr").first
            assert "unknown" in first.inner_text() and "order-42" in first.inner_text()
            checks.page(page, "acme-records")
            # A post without the CSRF token, from its own session, is refused.
            res = ctx.request.post(base + "/ui/resolve", form=form)
            assert res.status == 403, res.status
            assert record_state(base) == "unknown"
            with page.expect_navigation():
                # From the unknown outcomes' table (the record is in the listing's too).
                page.get_by_role("link", name="order-42").first.click()
            timeline = page.locator("ol.timeline").inner_text()
            assert "reserved" in timeline and "unknown" in timeline, timeline
            checks.page(page, "acme-record-unknown")

            # Resolve it, behind the confirmation page, with a reason.
            with page.expect_navigation():
                page.get_by_role("link", name="Resolve…").click()
            assert page.locator(".result-field").is_hidden()  # the script hides it until chosen
            page.get_by_label("It happened").check()
            assert page.locator(".result-field").is_visible()
            page.get_by_label("Result (JSON)").fill('{"charged": 42}')
            page.get_by_label("Reason").fill("the bank statement shows the charge")
            checks.page(page, "acme-resolve-confirm")
            with page.expect_navigation():
                page.get_by_role("button", name="Confirm resolution").click()
            assert page.url.endswith(record_path), page.url
            assert "completed" in page.locator("dl.facts").inner_text()
            timeline = page.locator("ol.timeline").inner_text()
            assert "resolved" in timeline and "console:tenant:acme" in timeline, timeline
            assert "the bank statement shows the charge" in timeline, timeline
            checks.page(page, "acme-record-resolved")

            # A retried call through the gateway gets the resolution.
            status, again = api(base, ACME, "POST", "/v1/tools/charge/begin", {"amount": 42}, "order-42")
            assert status == 200 and again["decision"] == "replayed", (status, again)
            assert again["outcome"]["result"] == {"charged": 42}, again

            # Charts: the tenant's own tools only; the operator's all.
            res = page.goto(base + "/ui/charts")
            assert page.locator("section.tool h3").all_inner_texts() == ["charge"]
            checks.page(page, "acme-charts", res)
            res = op.goto(base + "/ui/charts")
            assert op.locator("section.tool h3").all_inner_texts() == ["charge", "invoice"]
            totals = op.locator("section.tool table").first.inner_text()
            checks.page(op, "operator-charts", res)

            # Reopen the invoice as the operator, behind its confirmation.
            op.goto(base + "/ui/record?tenant=globex&tool=invoice&key=invoice-7")
            with op.expect_navigation():
                op.get_by_role("link", name="Reopen…").click()
            checks.page(op, "operator-reopen-confirm")
            op.get_by_label("Reason").fill("the customer asked for a new invoice")
            with op.expect_navigation():
                op.get_by_role("button", name="Confirm reopening").click()
            checks.page(op, "operator-reopened")
            status, _ = api(base, GLOBEX, "GET", "/v1/tools/invoice/records/invoice-7")
            assert status == 404, status

            # Observe mode (shadow mode): a duplicate of a completed mail runs (the program is
            # told to pass it through, and what enforce would have answered), and the operator
            # finds it with the records page's "observed" filter, on the record's timeline too.
            status, begun = api(base, ACME, "POST", "/v1/tools/mail/begin", {"to": "ann"}, "mail-1")
            assert status == 201, (status, begun)
            status, done = api(base, ACME, "POST", "/v1/tools/mail/complete",
                               {"key": "mail-1", "lease": begun["lease"],
                                "outcome": {"kind": "success", "result": {"sent": 1}}})
            assert status == 200, (status, done)
            status, dup = api(base, ACME, "POST", "/v1/tools/mail/begin", {"to": "ann"}, "mail-1")
            assert status == 200 and dup == {"decision": "pass_through", "observed": "replayed"}, (
                status, dup)
            op.goto(base + "/ui")
            op.get_by_label("Observed calls only").check()
            with op.expect_navigation():
                op.get_by_role("button", name="Filter").click()
            rows = op.locator("tbody tr")
            assert rows.count() == 1, rows.all_inner_texts()
            row = rows.nth(0).inner_text()
            assert "mail-1" in row and "replayed ×1" in row, row
            checks.page(op, "operator-observed")
            with op.expect_navigation():
                op.get_by_role("link", name="mail-1").click()
            timeline = op.locator("ol.timeline").inner_text()
            assert "enforce mode would have replayed" in timeline, timeline
            checks.page(op, "operator-record-observed")

            # Sign out ends the session.
            with page.expect_navigation():
                page.get_by_role("button", name="Sign out").click()
            page.goto(base + "/ui")
            assert page.url.endswith("/ui/login"), page.url
            browser.close()
        print(f"console browser test: ok ({checks.shots} pages checked; charge totals: "
              f"{' '.join(totals.split())})")
    finally:
        stop_gateway(gateway, work)


if __name__ == "__main__":
    main()
    sys.exit(0)
