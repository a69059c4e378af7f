"""The playground page that `corral serve` serves at `/`, driven in real headless Chromium against
a real server (the session's, which needs an API key): the page asks for the key; a refused schema
is marked at the line its JSON pointer names; the fixed schema generates, streams and validates
(jsonschema judges here too); the token view shows the tokens the grammar forced; a tool
definition produces a tool call; the server panel draws from /metrics; the page fits a narrow
window; and the browser's console stays free of errors. Screenshots of each state are written
under the test's temporary folder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import jsonschema
import pytest
from playground_browser import chromium_driver

WAIT_S = 180  # a generation on two shared CPU cores

FIXED = {
    "type": "object",
    "additionalProperties": False,
    "required": ["kind", "x", "y"],
    "properties": {
        "kind": {"const": "point"},
        "x": {"type": "integer", "minimum": 0, "maximum": 9},
        "y": {"type": "integer", "minimum": 0, "maximum": 9},
    },
}
# `contains` is refused (the backend cannot enforce it); the refusal's pointer is
# /properties/tags/contains, written on line 8 of this text.
REFUSED = """{
  "type": "object",
  "required": ["tags"],
  "properties": {
    "tags": {
      "type": "array",
      "items": {"type": "string"},
      "contains": {"const": "red"}
    }
  }
}"""
REFUSED_LINE = 8


def test_the_page_and_its_files_are_served_without_the_key(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    scripts = re.findall(r'src="(/playground/[^"]+)"', page.text)
    styles = re.findall(r'href="(/playground/[^"]+)"', page.text)
    assert scripts and styles
    for path in scripts + styles:
        r = httpx.get(server.url + path)
        assert r.status_code == 200 and r.content, path
    # nothing the page loads comes from elsewhere
    assert not re.search(r'(src|href)="(https?:)?//', page.text)
    assert httpx.get(server.url + "/playground/config.json").json() == {"api_key_required": True}
    for bad in ("/playground/nope.js", "/playground/..%2Fapp.py", "/playground/routes.py"):
        assert httpx.get(server.url + bad).status_code == 404, bad
    # the API behind it still needs the key
    assert httpx.get(server.url + "/v1/models").status_code == 401


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("playground-screenshots")
    print(f"playground screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def browser(server):
    driver = chromium_driver()
    driver.get(server.url + "/")
    yield driver
    driver.quit()


def wait(driver, condition, timeout=WAIT_S):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: condition(d))


def by_id(driver, name):
    return driver.find_element("id", name)


def choose(driver, select_id: str, value: str | None = None, text: str | None = None) -> None:
    from selenium.webdriver.support.ui import Select

    sel = Select(by_id(driver, select_id))
    sel.select_by_value(value) if value is not None else sel.select_by_visible_text(text)


def paste(driver, text: str) -> None:
    """Replace the editor's text as a paste would: select all, then type the new text."""
    from selenium.webdriver.common.keys import Keys

    editor = by_id(driver, "editor")
    editor.click()
    editor.send_keys(Keys.CONTROL, "a")
    editor.send_keys(Keys.DELETE)
    editor.send_keys(text)


def check_text(driver) -> str:
    return by_id(driver, "check").text


def generate(driver) -> list:
    """Ctrl+Enter from the user message, then wait for the stream to end; the choices."""
    from selenium.webdriver.common.keys import Keys

    before = by_id(driver, "choices").get_attribute("data-done")
    by_id(driver, "user").send_keys(Keys.CONTROL, Keys.ENTER)
    wait(driver, lambda d: by_id(d, "choices").get_attribute("data-done") not in (None, before)
         or "failed" in by_id(d, "run-state").text or "refused" in by_id(d, "run-state").text)  # fmt: skip
    state = by_id(driver, "run-state").text
    assert state.startswith("done"), state
    return driver.find_elements("css selector", "#choices .choice")


def test_the_page_asks_for_the_key_then_connects(browser, server, shots):
    form = by_id(browser, "key-form")
    wait(browser, lambda d: form.is_displayed(), 30)
    assert browser.switch_to.active_element == by_id(browser, "api-key")  # focused for typing
    browser.save_screenshot(str(shots / "01-key.png"))
    by_id(browser, "api-key").send_keys(server.api_key + "\n")
    wait(browser, lambda d: "ok" in by_id(d, "server-state").get_attribute("class"), 30)
    assert by_id(browser, "model").get_attribute("value") == server.model
    # the default example (a schema) is checked at once
    wait(browser, lambda d: check_text(d).startswith("✓"), 120)
    browser.save_screenshot(str(shots / "02-connected.png"))


def test_a_refused_keyword_is_marked_at_its_line_and_clears_when_fixed(browser, shots):
    paste(browser, REFUSED)
    wait(browser, lambda d: "contains" in check_text(d), 120)
    check = by_id(browser, "check")
    assert check.get_attribute("data-line") == str(REFUSED_LINE), check.text
    assert (
        check.text.startswith(f"line {REFUSED_LINE}:") and "/properties/tags/contains" in check.text
    )
    marked = browser.find_elements("css selector", "#gutter .err")
    assert [m.text for m in marked] == [str(REFUSED_LINE)]
    browser.save_screenshot(str(shots / "03-refused.png"))
    # JSON that does not parse is marked too, before any request
    paste(browser, '{\n  "type": "object",\n  "properties": {\n    "x": {"type": }\n  }\n}')
    wait(browser, lambda d: check_text(d).startswith("line 4: JSON syntax"), 30)
    # the fix: the fixed-keys schema
    paste(browser, json.dumps(FIXED, indent=2))
    wait(browser, lambda d: check_text(d).startswith("✓"), 120)
    assert "enforced exactly" in check_text(browser)
    assert browser.find_elements("css selector", "#gutter .err") == []
    by_id(browser, "compile").click()
    wait(browser, lambda d: "server's cache" in by_id(d, "compile-result").text, 120)
    # validating compiled it a moment ago: precompiling finds it in memory
    assert by_id(browser, "compile-result").text == "already in the server's cache (memory hit)"
    browser.save_screenshot(str(shots / "04-fixed.png"))


def test_generation_streams_validates_and_shows_forced_tokens(browser, shots):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    for field, value in (("max-tokens", "40"), ("temperature", "0.8"), ("seed", "7")):
        by_id(browser, field).clear()
        by_id(browser, field).send_keys(value)
    (choice,) = generate(browser)
    output = choice.find_element("css selector", ".output").text
    jsonschema.validate(json.loads(output), FIXED)  # the test's judge, not the page's
    assert choice.get_attribute("data-verdict") == "valid"
    assert "validates against the schema" in choice.find_element("css selector", ".verdict").text
    forced = choice.find_elements("css selector", ".tok.forced")
    assert forced, "no token shown as forced by the grammar"
    assert "kind" in "".join(t.text for t in forced)
    assert "".join(t.text for t in choice.find_elements("css selector", ".tok")) == output
    legend = {s.get_attribute("class"): int(s.get_attribute("data-count"))
              for s in choice.find_elements("css selector", ".legend span")}  # fmt: skip
    assert legend["forced"] == len(forced) and legend["sampled"] > 0
    ActionChains(browser).move_to_element(forced[0]).perform()
    detail = choice.find_element("css selector", ".detail")
    assert "forced by the grammar" in detail.text and "allowed by the mask" in detail.text
    sampled = choice.find_elements("css selector", ".tok.sampled")
    ActionChains(browser).move_to_element(sampled[0]).perform()
    assert "sampled from the model" in detail.text and "top alternatives" in detail.text
    browser.save_screenshot(str(shots / "05-generated.png"))
    # keyboard: the token view moves with the arrow keys
    box = choice.find_element("css selector", ".tokens")
    box.send_keys(Keys.HOME)
    box.send_keys(Keys.ARROW_RIGHT)
    assert detail.text.startswith("#2 ")
    costs = {
        d.get_attribute("data-key"): d.text
        for d in browser.find_elements("css selector", "#costs dd")
    }
    assert costs["time to first token"].endswith(" ms") and costs["cache tier"] == "memory"
    assert float(costs["tokens per second"]) > 0 and costs["exact"] == "yes"
    assert "prompt tokens" in costs["from the radix cache"]
    rewrites = by_id(browser, "rewrites").text
    assert "close_objects" in rewrites or "none" in rewrites or "keyword" in rewrites


def test_a_tool_definition_produces_a_tool_call(browser, shots):
    choose(browser, "kind", value="tools")
    wait(browser, lambda d: check_text(d).startswith("✓"), 120)
    tools = json.loads(by_id(browser, "editor").get_attribute("value"))
    by_id(browser, "user").clear()
    by_id(browser, "user").send_keys("What is the weather in Oslo?")
    (choice,) = generate(browser)
    text = choice.find_element("css selector", ".output").text
    name, _, args = text.partition("(")
    assert name == "get_weather", text
    jsonschema.validate(json.loads(args[:-1]), tools[0]["function"]["parameters"])
    assert choice.get_attribute("data-verdict") == "valid"
    assert choice.get_attribute("data-finish") == "tool_calls"
    assert "tool_calls" in by_id(browser, "rewrites").text
    browser.save_screenshot(str(shots / "06-tool-call.png"))


def test_the_server_panel_draws_from_metrics(browser, shots):
    for chart in ("ttft", "itl", "throughput"):
        wait(browser, lambda d, c=chart: int(by_id(d, f"chart-{c}").get_attribute("data-points") or 0) >= 1, 30)  # fmt: skip
    inked = browser.execute_script(
        """const c = document.querySelector('#chart-ttft canvas');
        const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 0; i < px.length; i += 4) if (px[i + 2] > 150 && px[i] < 80) n++;
        return n;"""
    )
    assert inked > 10  # the accent-coloured line and points were drawn
    value = by_id(browser, "chart-ttft").find_element("css selector", "header b").text
    assert float(value) > 0
    browser.find_element("id", "server").location_once_scrolled_into_view  # noqa: B018
    browser.save_screenshot(str(shots / "07-server-panel.png"))


def test_the_page_fits_a_narrow_window(browser, shots):
    browser.set_window_size(420, 900)
    try:
        overflow = browser.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0
        browser.execute_script("window.scrollTo(0, 0)")
        browser.save_screenshot(str(shots / "08-narrow.png"))
    finally:
        browser.set_window_size(1280, 800)


def test_no_console_errors(browser):
    """Every console error fails, but the network line Chromium logs for the refusal the page
    asked for (the validate endpoint's 400 is how a refusal is answered)."""
    errors = [
        e for e in browser.get_log("browser")
        if e["level"] == "SEVERE"
        and not (e["source"] == "network" and "/v1/constraints/validate" in e["message"]
                 and "400" in e["message"])
    ]  # fmt: skip
    assert errors == []
