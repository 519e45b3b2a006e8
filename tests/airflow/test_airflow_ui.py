"""The Liftbridge connection form in Airflow's web UI, driven by a real headless Chromium.

`airflow api-server` serves the UI on 127.0.0.1 from the session's Airflow home
(SimpleAuthManager with every user an admin, so no login; connection testing
enabled). Selenium drives Debian's Chromium through its chromedriver
(`tools/install-browser.sh` installs both): the tests add connections in the
Add Connection form, test them with the Test Connection button of the
connections list (Airflow 3.3 has no Test button in the form itself), and read
what was saved through the REST API. Screenshots and the api-server's log are
kept in artifacts/ui/.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from selenium import webdriver
from selenium.common.exceptions import ElementNotInteractableException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from liftbridge_provider.devserver import DevServer, start_single
from liftbridge_provider.devserver.config import LOOPBACK, free_port
from liftbridge_provider.devserver.process import ServerProcess
from liftbridge_provider.get_provider_info import get_provider_info
from liftbridge_provider.hooks.liftbridge import config_from_connection

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "ui"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# Without the background-networking flags Chromium's own calls home fail on a closed network.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--no-proxy-server",
    "--window-size=1280,1900",
]
SERVER_ENV = {
    "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
    "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
}
WAIT = 30.0  # seconds any one thing may take to show up in the browser
DIALOG = "//*[@role='dialog']"
TOAST = "//*[@data-scope='toast' and @data-part='root']"
CONNECTION_TYPE = get_provider_info()["connection-types"][0]
BEHAVIOUR = CONNECTION_TYPE["ui-field-behaviour"]


@dataclass(frozen=True)
class Toast:
    """A notification the UI showed: its type (success, error), title and description."""

    kind: str
    title: str
    description: str


def _answers(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="module")
def api_server(airflow_home: Path) -> Iterator[str]:
    """`airflow api-server` on a free loopback port (killed if pytest dies); yields its base URL."""
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = ARTIFACTS / "api-server.log"
    log.unlink(missing_ok=True)
    argv = [AIRFLOW, "api-server", "--host", LOOPBACK, "--port", str(port)]
    server = ServerProcess(argv, log, env={**os.environ, **SERVER_ENV})
    server.start()
    try:
        server.wait_for(lambda: _answers(f"{url}/api/v2/monitor/health"), 120, f"HTTP answers at {url}")
        yield url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    """Headless Chromium with a fresh profile, driven through the system chromedriver."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: the UI test needs Chromium and its driver. "
            "Install them with `make browser` (tools/install-browser.sh; `make test` runs it), "
            "or: apt-get install chromium chromium-driver",
            pytrace=False,
        )
    launchers = tmp_path_factory.mktemp("chromium")
    options = webdriver.ChromeOptions()
    options.binary_location = _tied_to_parent(CHROMIUM, launchers)
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={launchers / 'profile'}"]:
        options.add_argument(flag)
    # An explicit driver path: Selenium Manager never runs (it would try to download a driver).
    driver = webdriver.Chrome(options=options, service=Service(_tied_to_parent(CHROMEDRIVER, launchers)))
    try:
        yield driver
    finally:
        driver.quit()


def _tied_to_parent(executable: Path, folder: Path) -> str:
    """A launcher in ``folder`` that runs ``executable`` SIGKILLed when its parent dies (util-linux setpriv).

    Chained (pytest, chromedriver, Chromium), a killed test run leaves no browser behind.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return str(executable)
    launcher = folder / executable.name
    launcher.write_text(f'#!/bin/sh\nexec {setpriv} --pdeathsig KILL -- {executable} "$@"\n')
    launcher.chmod(0o755)
    return str(launcher)


class ConnectionsPage:
    """Airflow's Admin > Connections page, found by labels, roles, names and test ids."""

    def __init__(self, driver: WebDriver, base_url: str) -> None:
        self.driver = driver
        self.base_url = base_url

    def _wait(self) -> WebDriverWait[WebDriver]:
        return WebDriverWait(self.driver, WAIT, ignored_exceptions=[StaleElementReferenceException])

    def _visible(self, xpath: str) -> WebElement:
        element: WebElement = self._wait().until(ec.visibility_of_element_located((By.XPATH, xpath)), xpath)
        return element

    def _click(self, xpath: str) -> None:
        self._wait().until(ec.element_to_be_clickable((By.XPATH, xpath)), xpath).click()

    def open(self) -> None:
        self.driver.get(f"{self.base_url}/connections")
        self._visible("//button[normalize-space()='Add Connection']")

    def add(self, conn_id: str, hook_name: str) -> None:
        """Open the Add Connection form, name the connection and choose its type."""
        self._click("//button[normalize-space()='Add Connection']")
        self.type_into("Connection ID", conn_id)
        self.type_into("Connection Type", hook_name)
        self._click(f"{DIALOG}//*[@role='option'][normalize-space()='{hook_name}']")

    def type_into(self, label: str, text: str) -> None:
        """Type ``text`` into the field labelled ``label`` once it takes input: the dialog's fields are
        visible a moment before they are interactable while it opens (CI, on a loaded machine: "element
        not interactable")."""

        def typed(_: WebDriver) -> bool:
            try:
                self.field(label).send_keys(text)
            except ElementNotInteractableException:
                return False
            return True

        self._wait().until(typed, f"the field {label!r} never took input")

    def group(self, label: str) -> WebElement:
        """The dialog's visible field (label, control and help text) labelled ``label``."""
        return self._visible(f"{DIALOG}//*[@role='group'][.//label[normalize-space(text())='{label}']]")

    def field(self, label: str) -> WebElement:
        """The input or text area of the field labelled ``label``."""
        return self.group(label).find_element(By.XPATH, "(.//input | .//textarea)[1]")

    def labels(self) -> set[str]:
        """The texts of the labels in the dialog (the required marker left off)."""
        texts = (
            label.get_attribute("textContent") or ""
            for label in self.driver.find_elements(By.XPATH, DIALOG + "//label")
        )
        return {" ".join(text.replace("*", "").split()) for text in texts} - {""}

    def open_section(self, title: str) -> None:
        """Expand the form's accordion section ``title`` (Standard Fields, Extra Fields, ...)."""
        trigger = f"{DIALOG}//button[@aria-expanded][normalize-space()='{title}']"
        self._click(trigger)
        self._visible(f"{trigger}[@aria-expanded='true']")

    def switch_on(self, label: str) -> None:
        """Turn on the switch of the field labelled ``label``."""
        checkbox = self.group(label).find_element(By.XPATH, ".//input[@type='checkbox']")
        self.group(label).find_element(By.XPATH, ".//label[.//input[@type='checkbox']]").click()
        self._wait().until(lambda _: checkbox.is_selected(), f"switch {label!r} did not turn on")

    def save(self, conn_id: str) -> None:
        """Press Save and wait until the connection is listed."""
        self._click(f"{DIALOG}//button[normalize-space()='Save']")
        self._wait().until(ec.invisibility_of_element_located((By.XPATH, DIALOG)), "the form stayed open")
        self.row(conn_id)

    def close(self) -> None:
        self._click(f"{DIALOG}//button[@aria-label='Close']")
        self._wait().until(ec.invisibility_of_element_located((By.XPATH, DIALOG)), "the form stayed open")

    def row(self, conn_id: str) -> WebElement:
        return self._visible(f"//tr[td[@data-testid='table-cell-connection_id'][normalize-space()='{conn_id}']]")

    def test_connection(self, conn_id: str) -> Toast:
        """Press the Test Connection button of the connection's row; the notification that answers."""
        seen = {toast.get_attribute("id") for toast in self.driver.find_elements(By.XPATH, TOAST)}
        self.row(conn_id).find_element(By.XPATH, ".//button[@aria-label='Test Connection']").click()
        found: Toast = self._wait().until(lambda _: self._new_test_toast(seen), "no Test Connection notification")
        return found

    def _new_test_toast(self, seen: set[str | None]) -> Toast | Literal[False]:
        """A new, fully shown notification titled "Test Connection ...", if there is one yet."""
        for toast in self.driver.find_elements(By.XPATH, TOAST):
            if toast.get_attribute("id") in seen or toast.value_of_css_property("opacity") != "1":
                continue
            title, description = (_text(toast, f".//*[@data-part='{part}']") for part in ("title", "description"))
            if title.startswith("Test Connection"):
                return Toast(toast.get_attribute("data-type") or "", title, description)
        return False

    def screenshot(self, name: str) -> Path:
        path = ARTIFACTS / f"{name}.png"
        assert self.driver.save_screenshot(str(path)), f"could not save {path}"
        print(f"screenshot: {path}")
        return path


def _text(element: WebElement, xpath: str) -> str:
    """The text of the element at ``xpath`` under ``element``, shown or not, with whitespace normalised."""
    return " ".join((element.find_element(By.XPATH, xpath).get_attribute("textContent") or "").split())


@pytest.fixture
def page(browser: WebDriver, api_server: str) -> ConnectionsPage:
    connections = ConnectionsPage(browser, api_server)
    connections.open()
    return connections


def fill_liftbridge_form(page: ConnectionsPage, conn_id: str, brokers: str, port: str, screenshot: str = "") -> None:
    """Add a Liftbridge connection in the form: brokers, default port, and a few extras; then save it."""
    page.add(conn_id, CONNECTION_TYPE["hook-name"])
    page.type_into("Brokers", brokers)
    page.type_into("Default port", port)
    if screenshot:
        page.screenshot(f"{screenshot}-standard-fields")
    page.open_section("Extra Fields")
    page.type_into("Request timeout (s)", "2")
    page.type_into("Max connections per broker", "1")
    page.switch_on("Read from ISR replicas")
    if screenshot:
        page.screenshot(f"{screenshot}-extra-fields")
    page.save(conn_id)


def saved_connection(base_url: str, conn_id: str) -> dict[str, Any]:
    """The connection as the REST API returns it (``GET /api/v2/connections/{id}``, extra parsed)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{base_url}/auth/token", timeout=WAIT) as response:  # every user is an admin
        token = json.load(response)["access_token"]
    request = urllib.request.Request(
        f"{base_url}/api/v2/connections/{conn_id}", headers={"Authorization": f"Bearer {token}"}
    )
    with opener.open(request, timeout=WAIT) as response:
        connection: dict[str, Any] = json.load(response)
    connection["extra"] = json.loads(connection["extra"] or "{}")
    return connection


def new_conn_id() -> str:
    return f"liftbridge_ui_{uuid.uuid4().hex[:8]}"


def test_add_connection_shows_the_liftbridge_fields(page: ConnectionsPage) -> None:
    page.add(new_conn_id(), CONNECTION_TYPE["hook-name"])
    for field, label in BEHAVIOUR["relabeling"].items():
        assert page.field(label).get_attribute("name") == field
        assert page.field(label).get_attribute("placeholder") == BEHAVIOUR["placeholders"][field]
    for field in BEHAVIOUR["hidden-fields"]:
        assert not page.driver.find_elements(By.XPATH, f"{DIALOG}//*[@name='{field}']"), field

    page.open_section("Extra Fields")
    for key, spec in CONNECTION_TYPE["conn-fields"].items():
        group = page.group(spec["label"])
        control = group.find_element(By.XPATH, f".//*[@name='element_{key}']")
        assert rendered_as(control) == expected_control(spec["schema"]), key
        assert spec["description"] in group.text
    page.screenshot("form-extra-fields-empty")
    shown = page.labels()
    assert shown == {
        "Connection ID",
        "Connection Type",
        "Description",
        *BEHAVIOUR["relabeling"].values(),
        *(spec["label"] for spec in CONNECTION_TYPE["conn-fields"].values()),
    }
    assert {"Brokers", "Default port", "TLS CA certificate", "Request timeout (s)", "Read from ISR replicas"} <= shown
    assert not shown & {"Host", "Port", "Login", "Password", "Schema"}, "Airflow's own labels of hidden fields"
    page.close()


def expected_control(schema: dict[str, Any]) -> str:
    """The control Airflow's form renders for a conn-field of this JSON schema."""
    if schema.get("format") in ("multiline", "password"):
        return str(schema["format"])
    if {"number", "integer"} & set(schema["type"]):
        return "number"
    return "switch" if "boolean" in schema["type"] else "text"


def rendered_as(control: WebElement) -> str:
    """What kind of control an extra field got, in the terms of :func:`expected_control`."""
    if control.tag_name == "textarea":
        return "multiline"
    if control.get_attribute("role") == "spinbutton":
        return "number"
    return {"password": "password", "checkbox": "switch"}.get(control.get_attribute("type") or "", "text")


def test_connection_to_a_running_node_tests_ok_and_is_saved(
    page: ConnectionsPage, liftbridge_server: DevServer
) -> None:
    conn_id = new_conn_id()
    address = liftbridge_server.brokers[0]
    host, port = address.rsplit(":", 1)
    fill_liftbridge_form(page, conn_id, host, port, screenshot="form-filled")

    toast = page.test_connection(conn_id)
    page.screenshot("test-connection-success")
    assert (toast.kind, toast.title) == ("success", "Test Connection Successful"), toast
    assert toast.description.startswith(f"Connected: 1 broker(s) ({address}), "), toast

    saved = saved_connection(page.base_url, conn_id)
    assert (saved["conn_type"], saved["host"], saved["port"]) == ("liftbridge", host, int(port))
    extra = saved["extra"]
    assert {k: v for k, v in extra.items() if v is not None} == {
        "request_timeout": 2,
        "max_conns_per_broker": 1,
        "read_isr_replica": True,
    }
    config = config_from_connection(saved["host"], saved["port"], extra)
    assert (config.brokers, config.request_timeout, config.max_conns_per_broker) == ((address,), 2.0, 1)
    assert config.read_isr_replica is True


def test_connection_to_a_stopped_node_reports_why(page: ConnectionsPage) -> None:
    with start_single() as stopped:
        address = stopped.brokers[0]
    conn_id = new_conn_id()
    # Brokers as host:port, and a default port all the same: for a connection without a port,
    # Airflow 3.3.2's Test button sends port 0, which the API refuses as another endpoint ("Bad Request").
    fill_liftbridge_form(page, conn_id, address, "9292")

    toast = page.test_connection(conn_id)
    page.screenshot("test-connection-failure")
    assert (toast.kind, toast.title) == ("error", "Test Connection Failed"), toast
    assert toast.description.startswith(f"Cannot reach any broker at {address} (is Liftbridge running there?)"), toast
    saved = saved_connection(page.base_url, conn_id)
    assert (saved["conn_type"], saved["host"], saved["port"]) == ("liftbridge", address, 9292)
