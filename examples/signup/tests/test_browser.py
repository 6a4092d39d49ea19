"""The sign-up example in a real browser: Debian's chromium, headless, driven through
chromium-driver by selenium. tests/all/signup_browser.rs starts PostgreSQL, valkey-server with
the module and app.py, then runs this with SIGNUP_URL (the app) and SIGNUP_PG (its database).

Every wait is for a condition of the page (the answer shown for the name typed), never a
fixed sleep.
"""

import json
import os
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request

import psycopg
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

URL = os.environ["SIGNUP_URL"]
PG = os.environ["SIGNUP_PG"]
# Long enough for a busy machine; a passing run waits only as long as the page takes.
WAIT_S = 15


@pytest.fixture
def app():
    """Waits until the app answers: it starts while pytest and the browser do (so a test
    asks for `browsers` before `app`)."""
    def answers():
        try:
            with urllib.request.urlopen(URL + "check?username=probe", timeout=WAIT_S) as r:
                return r.status == 200
        except OSError:
            return False

    deadline = time.monotonic() + 30
    while not answers():
        assert time.monotonic() < deadline, f"the app never answered at {URL}"
        time.sleep(0.05)  # polling for a condition, not waiting for time to pass


@pytest.fixture
def browsers():
    """Opens headless chromium sessions, each with a profile of its own (one visitor each);
    all are quit at the end."""
    opened = []

    def open_one():
        profile = tempfile.mkdtemp(prefix="signup-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                    "--disable-gpu", "--no-first-run", "--disable-extensions",
                    "--disable-background-networking", "--disable-component-update",
                    "--window-size=640,520", f"--user-data-dir={profile}"):
            options.add_argument(arg)
        service = Service(
            executable_path=os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
        driver = webdriver.Chrome(options=options, service=service)
        opened.append((driver, profile))
        return driver

    # The first session starts at once, while the app does (see `app`).
    first = [open_one()]
    yield lambda: first.pop() if first else open_one()
    for driver, profile in opened:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


class Page:
    """The sign-up page in a browser session of its own: one visitor."""

    def __init__(self, driver):
        driver.get(URL)
        self.driver = driver
        self.window = driver.current_window_handle

    def find(self, element_id):
        self.driver.switch_to.window(self.window)
        return self.driver.find_element(By.ID, element_id)

    def type(self, name):
        field = self.find("username")
        field.clear()
        field.send_keys(name)

    def sign_up(self):
        self.find("signup").click()

    def shown(self, element_id, name, status):
        """Waits until the element shows the answer `status` for `name`; returns its text."""
        el = self.find(element_id)

        def ready(_):
            return (el.get_attribute("data-name") == name
                    and el.get_attribute("data-status") == status)

        try:
            WebDriverWait(self.driver, WAIT_S).until(ready)
        except Exception:
            got = (el.get_attribute("data-name"), el.get_attribute("data-status"), el.text)
            raise AssertionError(f"#{element_id}: wanted {name!r} {status!r}, shows {got}")
        return el.text


def post_signup(name):
    """POST /signup as the page does: (HTTP status, reply)."""
    req = urllib.request.Request(
        URL + "signup", data=json.dumps({"username": name}).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def rows(name):
    with psycopg.connect(PG) as db:
        return db.execute("SELECT count(*) FROM signup.users WHERE lower(username) = lower(%s)",
                          (name,)).fetchone()[0]


def test_taken_available_sign_up_and_a_duplicate(browsers, app):
    assert post_signup("alice") == (201, {"username": "alice", "status": "created",
                                          "message": "Welcome, alice!"})
    first = Page(browsers())
    first.type("Alice")  # NORMALIZE lower: the same name
    assert first.shown("status", "Alice", "taken") == "Alice is taken"
    first.type("carol")
    assert first.shown("status", "carol", "available") == "carol is available"

    # A second visitor sees "carol" free too, before the first one signs up.
    second = Page(browsers())
    second.type("carol")
    second.shown("status", "carol", "available")

    first.sign_up()
    assert first.shown("result", "carol", "created") == "Welcome, carol!"
    first.shown("status", "carol", "taken")

    # The second visitor's page still says "available" (a hint); the sign-up is refused.
    second.sign_up()
    assert second.shown("result", "carol", "taken") == "carol is taken: pick another"
    second.shown("status", "carol", "taken")
    assert rows("carol") == 1

    if os.environ.get("SIGNUP_SCREENSHOT"):
        first.type("dave")
        first.shown("status", "dave", "available")
        first.driver.save_screenshot(os.environ["SIGNUP_SCREENSHOT"])


def test_two_sign_ups_at_once_one_wins(app):
    """The race no page can see: the table's unique index lets exactly one through."""
    start = threading.Barrier(2)
    answers = []

    def sign_up():
        start.wait()
        answers.append(post_signup("Erin")[0])

    threads = [threading.Thread(target=sign_up) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == [201, 409]
    assert rows("erin") == 1
    assert post_signup("ERIN")[0] == 409


def test_bad_names_are_refused_before_any_write(app):
    assert post_signup("no spaces")[0] == 400
    assert post_signup("x")[0] == 400
    assert rows("no spaces") == 0
