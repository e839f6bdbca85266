"""The page `idemgate scan --html` writes, in a real headless browser (Debian's chromium, driven
by Playwright), run by scripts/test-console with the same environment as console-browser.py
(IDEMGATE_BIN, AXE_JS, SCREENSHOTS).

It writes a trace with one duplicate that ran, one a gate caught, a repeated read and a distinct
action, has `idemgate scan --html` draw the page, opens it from the file, and checks: the summary,
each row's class and words, that each call's bar is drawn inside its timeline where its time
says (the repeat's bar to the right of the first call's, in the duplicate's colour), that hostile
text from the trace stays text (no script runs, none is in the page), no axe-core violation, and
no request leaves the page. A screenshot goes beside the console's.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

BIN = os.environ["IDEMGATE_BIN"]
AXE = Path(os.environ["AXE_JS"]).read_text()
SHOTS = Path(os.environ["SCREENSHOTS"])
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]

T0 = 1_800_000_000_000_000_000
HOSTILE = '<img src=x onerror="window.pwned=1"><script>window.pwned=1</script>'


def span(n: int, tool: str, call_id: str, args: dict, start_s: float, end_s: float,
         verdict: str | None = None) -> dict:
    attrs = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.call.arguments": json.dumps(args),
        "gen_ai.conversation.id": "conv-1",
    }
    if verdict:
        attrs["idemgate.verdict"] = verdict
    return {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": f"{n:016x}",
        "name": f"execute_tool {tool}",
        "startTimeUnixNano": str(T0 + int(start_s * 1e9)),
        "endTimeUnixNano": str(T0 + int(end_s * 1e9)),
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()],
    }


def main() -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="idemgate-scan-page-"))
    charge = {"card": "4242", "amount_cents": 1999, "note": HOSTILE}
    spans = [
        span(1, "charge_card", "call-1", charge, 0, 2),
        span(2, "search", "call-2", {"q": "x"}, 3, 4),
        span(3, "search", "call-3", {"q": "x"}, 5, 6),
        span(4, "charge_card", "call-4", charge, 10, 12),
        span(5, "refund", "call-5", {"order": "o-1"}, 14, 15, "executed"),
        span(6, "refund", "call-6", {"order": "o-1"}, 16, 16.1, "replayed"),
        span(7, "charge_card", "call-7", {"card": "4242", "amount_cents": 500}, 18, 20),
    ]
    trace = work / "trace.jsonl"
    trace.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}) + "\n")
    page_file = work / "scan.html"
    done = subprocess.run([BIN, "scan", "--read", "search", "--html", str(page_file), str(trace)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    html = page_file.read_text()
    assert "<script" not in html and "<img" not in html, "trace text reached the page as markup"

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url) if not r.url.startswith("file:") else None)
        page.goto(page_file.as_uri())
        assert page.title() == "idemgate scan"
        summary = page.locator("#summary").inner_text()
        assert summary.startswith("1 likely duplicate side effect in 1 conversation"), summary
        assert "1 more repeat answered by idemgate" in summary, summary

        dup = page.locator("tr.dup")
        assert dup.count() == 1
        assert "call-4" in dup.inner_text() and "model re-emission" in dup.inner_text()
        caught = page.locator("tr.caught")
        assert caught.count() == 1 and "call-6" in caught.inner_text()
        assert page.locator("tr.read").count() == 2

        # Each bar inside its timeline, at its time: the conversation runs from 0 s to 20 s.
        def bar(call: str) -> tuple[float, float, str]:
            row = page.locator(f"tr:has(code:text-is('{call}'))")
            line = row.locator(".tl").bounding_box()
            box = row.locator(".bar").bounding_box()
            assert line and box, call
            assert line["x"] <= box["x"] and box["x"] + box["width"] <= line["x"] + line["width"] + 1, call
            colour = row.locator(".bar").evaluate("e => getComputedStyle(e).backgroundColor")
            return (box["x"] - line["x"]) / line["width"], box["width"] / line["width"], colour

        first, repeat = bar("call-1"), bar("call-4")
        assert abs(first[0] - 0.0) < 0.02 and abs(first[1] - 0.10) < 0.02, first
        assert abs(repeat[0] - 0.50) < 0.02 and abs(repeat[1] - 0.10) < 0.02, repeat
        assert repeat[2] == "rgb(217, 83, 79)" and first[2] != repeat[2], (first, repeat)

        # The hostile argument is shown as text, and ran nothing.
        assert page.evaluate("window.pwned === undefined")
        title = page.locator("tr:has(code:text-is('call-1')) .bar").get_attribute("title")
        assert title is not None and "<script>window.pwned=1</script>" in title, title

        page.evaluate(AXE + "\n;undefined")
        result = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
        assert not result["violations"], json.dumps(
            [{"id": v["id"], "nodes": [n["html"] for n in v["nodes"]]} for v in result["violations"]],
            indent=1)
        page.screenshot(path=str(SHOTS / "scan-page.png"), full_page=True)
        assert not requests, f"the page fetched {requests}"
        browser.close()
    print("scan-page-browser: the scan page checked in headless chromium")


if __name__ == "__main__":
    main()
