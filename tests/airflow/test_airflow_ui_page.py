"""The "Liftbridge" page of the provider's UI plugin, in a real `airflow api-server` and a headless Chromium.

The API server runs with SimpleAuthManager and two users: ``admin`` (may read
connections) and ``viewer`` (may not). A Liftbridge node of this module's own
holds a stream with three partitions, a cursor behind on one of them, a
watcher's cursor and a dead letter; Airflow's metadata DB holds the asset
watcher that names them. The tests read the JSON API with each user's token,
scan every answer for the connection's secrets, open the page in Airflow's
navigation, and stop a broker under an open page. A real DAG run (`airflow dags test`: freeze, wait,
spark-submit of the ingest job into a Parquet lake, commit) shows in the Runs view with its rows per range
from the claim ledger, and the cursors' lag over time is drawn once sampled twice. Screenshots:
artifacts/ui/page-*.png (docs/images/ keeps copies for docs/airflow.md).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.core.watching import dead_letter_headers
from liftbridge_provider.devserver import DevServer, start_single
from liftbridge_provider.devserver.config import LOOPBACK, free_port
from liftbridge_provider.devserver.process import ServerProcess
from liftbridge_provider.ui.airflow_sources import TRIGGER_CLASSPATH
from tests.airflow.airflow_runs import connection_env, run_dag
from tests.airflow.test_airflow_ui import AIRFLOW, ARTIFACTS, WAIT, _answers, browser

__all__ = ["browser"]  # the Chromium fixture of the connection form's test, shared

PASSWORD = "pw-" + uuid.uuid4().hex  # the connection's password: never in an answer
KEY_LINE = "MIIEv" + uuid.uuid4().hex.upper() + "QIBADANBgkqhkiG9w0BAQEFAASC"
PEM = f"-----BEGIN PRIVATE KEY-----\n{KEY_LINE}\n-----END PRIVATE KEY-----\n"
USERS = {"admin": "admin-" + uuid.uuid4().hex[:8], "viewer": "viewer-" + uuid.uuid4().hex[:8]}
STREAM, DLQ, CURSOR, WATCHER_CURSOR = "orders", "orders.dlq", "ingest-orders", "orders-watcher"
VAULT = ("lb_vault_watched", "lb_vault_unwatched")  # liftbridge connections only in a secrets backend


@dataclass(frozen=True)
class UiServer:
    url: str
    tokens: dict[str, str]
    home: Path

    def get(self, path: str, user: str | None = "admin") -> tuple[int, str, float]:
        """(status, body, seconds) of ``GET path`` as ``user`` (None: no token)."""
        headers = {"Authorization": f"Bearer {self.tokens[user]}"} if user else {}
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        began = time.monotonic()
        try:
            with opener.open(urllib.request.Request(self.url + path, headers=headers), timeout=WAIT) as response:
                return response.status, response.read().decode(), time.monotonic() - began
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), time.monotonic() - began

    def post(self, path: str, body: dict[str, Any], user: str | None = "admin") -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if user:
            headers["Authorization"] = f"Bearer {self.tokens[user]}"
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers=headers)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=WAIT) as response:
            answer: dict[str, Any] = json.load(response)
            return answer

    def add_connection(self, conn_id: str, host: str, **fields: Any) -> None:
        self.post("/api/v2/connections", {"connection_id": conn_id, "conn_type": "liftbridge", "host": host, **fields})


@pytest.fixture(scope="module")
def ui_server(airflow_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiServer]:
    """`airflow api-server` with the provider's plugins, SimpleAuthManager users admin and viewer."""
    passwords = tmp_path_factory.mktemp("auth") / "passwords.json"
    passwords.write_text(json.dumps(USERS))
    vault = tmp_path_factory.mktemp("secrets") / "connections.json"  # a secrets backend's connections
    vault.write_text(json.dumps({conn_id: {"conn_type": "liftbridge", "host": "127.0.0.1:9"} for conn_id in VAULT}))
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__SECRETS__BACKEND": "airflow.secrets.local_filesystem.LocalFilesystemBackend",
        "AIRFLOW__SECRETS__BACKEND_KWARGS": json.dumps({"connections_file_path": str(vault)}),
    }
    argv = [AIRFLOW, "api-server", "--host", LOOPBACK, "--port", str(port)]
    server = ServerProcess(argv, ARTIFACTS / "api-server-page.log", env=env)
    server.start()
    try:
        server.wait_for(lambda: _answers(f"{url}/api/v2/monitor/health"), 120, f"HTTP answers at {url}")
        bare = UiServer(url, {}, airflow_home)
        tokens = {
            user: bare.post("/auth/token", {"username": user, "password": password}, user=None)["access_token"]
            for user, password in USERS.items()
        }
        yield UiServer(url, tokens, airflow_home)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def page_node() -> Iterator[DevServer]:
    """A node of this module's own: a stream with three partitions, cursors, a dead letter."""
    with start_single() as node, LiftbridgeClient(node.brokers) as client:
        client.create_stream(STREAM, STREAM, partitions=3)
        client.create_stream(DLQ, DLQ, partitions=3)
        for i in range(30):
            client.publish(STREAM, f"order {i}".encode(), partition=i % 3)
        client.set_cursor(CURSOR, STREAM, 0, 5)  # high watermark 9: 4 behind
        client.set_cursor(CURSOR, STREAM, 1, 9)  # caught up
        client.set_cursor(CURSOR, STREAM, 2, 8)  # 1 behind
        client.set_cursor(WATCHER_CURSOR, STREAM, 0, 9)
        client.set_cursor(f"{WATCHER_CURSOR}.handover", STREAM, 0, 9)  # bookkeeping: counted, not listed
        refused = next(iter(client.read_range(STREAM, 1, 4, 5)))
        headers = dead_letter_headers(refused, cursor_id=WATCHER_CURSOR, error="ValueError: no customer id")
        client.publish(DLQ, refused.value, headers=headers, partition=1, ack_policy="all")
        yield node


@pytest.fixture(scope="module")
def watcher_in_db(airflow_home: Path) -> str:
    """An asset watcher on ``STREAM`` as Airflow records one (the trigger, the asset, one stored event)."""
    from airflow.models.asset import AssetEvent, AssetModel, AssetWatcherModel  # noqa: PLC0415
    from airflow.models.trigger import Trigger  # noqa: PLC0415
    from airflow.utils.session import create_session  # noqa: PLC0415

    kwargs = {"stream": STREAM, "liftbridge_conn_id": "lb_page", "cursor_id": WATCHER_CURSOR, "dlq_stream": DLQ}
    with create_session() as session:
        trigger = Trigger(classpath=TRIGGER_CLASSPATH, kwargs={**kwargs, "mode": "message"})
        asset = AssetModel(name="orders_asset", uri="liftbridge://orders", group="asset")
        session.add_all([trigger, asset])
        session.flush()
        session.add(AssetWatcherModel(name="orders_watcher", asset_id=asset.id, trigger_id=trigger.id))
        session.add(AssetEvent(asset_id=asset.id, extra={}))
        vaulted = Trigger(classpath=TRIGGER_CLASSPATH, kwargs={"stream": "audit", "liftbridge_conn_id": VAULT[0]})
        audit = AssetModel(name="audit_asset", uri="liftbridge://audit", group="asset")
        session.add_all([vaulted, audit])
        session.flush()
        session.add(AssetWatcherModel(name="audit_watcher", asset_id=audit.id, trigger_id=vaulted.id))
    return "orders_watcher"


@pytest.fixture(scope="module")
def connections(ui_server: UiServer, page_node: DevServer, watcher_in_db: str) -> dict[str, str]:
    """``lb_page`` (the node, with a password) and ``lb_page_tls`` (a TLS key for a plaintext node)."""
    host = page_node.brokers[0]
    ui_server.add_connection("lb_page", host, password=PASSWORD, extra=json.dumps({"request_timeout": 3}))
    tls_extra = {"tls_private_key": PEM, "tls_client_cert": PEM.replace("PRIVATE KEY", "CERTIFICATE")}
    ui_server.add_connection("lb_page_tls", host, password=PASSWORD, extra=json.dumps(tls_extra))
    return {"plain": "lb_page", "tls": "lb_page_tls"}


def secret_free(body: str) -> str:
    for secret in (PASSWORD, KEY_LINE, "BEGIN PRIVATE KEY"):
        assert secret not in body, f"a secret reached an answer: {body[:500]}"
    return body


API_PATHS = ["/liftbridge/", "/liftbridge/static/page.js", "/liftbridge/api/connections"]
API_PATHS += [f"/liftbridge/api/connections/lb_page{part}" for part in ("", "/streams", "/cursors", "/watchers")]


def test_the_api_shows_streams_cursor_lag_and_watchers_to_a_user_who_may_read_connections(
    ui_server: UiServer, connections: dict[str, str]
) -> None:
    status, body, _ = ui_server.get("/liftbridge/api/connections")
    assert status == 200, body
    listed = {c["conn_id"]: c for c in json.loads(secret_free(body))["connections"]}
    assert {"lb_page", "lb_page_tls"} <= set(listed)
    assert listed["lb_page_tls"]["tls"] is True

    status, body, took = ui_server.get("/liftbridge/api/connections/lb_page")
    assert status == 200, body
    overview = json.loads(secret_free(body))
    print(f"overview of lb_page: {took * 1000:.0f} ms (cluster {overview['elapsed_ms']} ms)")
    orders = next(s for s in overview["streams"] if s["stream"] == STREAM)
    assert [p["partition"] for p in orders["partitions"]] == [0, 1, 2]
    assert {p["high_watermark"] for p in orders["partitions"]} == {9}
    assert all(p["leader"] and p["isr"] == p["replicas"] and p["paused"] is False for p in orders["partitions"])
    cursor = next(r for r in overview["cursors"]["rows"] if r["cursor_id"] == CURSOR)
    assert [(p["partition"], p["offset"], p["lag"]) for p in cursor["partitions"]] == [(0, 5, 4), (1, 9, 0), (2, 8, 1)]
    assert overview["cursors"]["hidden"]["watcher-state"] >= 1
    assert all(r["cursor_id"] != f"{WATCHER_CURSOR}.handover" for r in overview["cursors"]["rows"])
    (watcher,) = overview["watchers"]["rows"]
    assert (watcher["name"], watcher["asset"], watcher["cursor_id"]) == (
        "orders_watcher",
        "orders_asset",
        WATCHER_CURSOR,
    )
    assert watcher["last_event"] is not None
    assert watcher["dead_letters"]["count"] == 1
    assert watcher["dead_letters"]["last"]["error"] == "ValueError: no customer id"
    assert [p["lag"] for p in watcher["partitions"]] == [0, 10, 10]

    for part in ("streams", "cursors", "watchers"):
        status, body, _ = ui_server.get(f"/liftbridge/api/connections/lb_page/{part}")
        assert status == 200, body
        assert set(json.loads(secret_free(body))) == {"connection", part, "age_s"}
    status, body, _ = ui_server.get("/liftbridge/api/connections/no_such_conn")
    assert status == 404, body


def test_a_secrets_backends_connection_is_listed_when_a_watcher_names_it_and_found_by_id_otherwise(
    ui_server: UiServer, connections: dict[str, str]
) -> None:
    """A secrets backend cannot be listed, so the page lists the connections the Liftbridge watchers name
    (from any backend: here Airflow's local-file one) besides the metadata DB's and the environment's; one
    nothing names is still found by id."""
    status, body, _ = ui_server.get("/liftbridge/api/connections")
    assert status == 200, body
    listed = {c["conn_id"] for c in json.loads(secret_free(body))["connections"]}
    assert VAULT[0] in listed, listed
    assert VAULT[1] not in listed, listed
    status, body, _ = ui_server.get(f"/liftbridge/api/connections/{VAULT[1]}")
    assert status == 503, body  # found: its broker at 127.0.0.1:9 answers nothing (an error, not 404 "no such")
    assert json.loads(secret_free(body))["error"]


def test_a_connection_with_secrets_answers_an_error_without_them(
    ui_server: UiServer, connections: dict[str, str]
) -> None:
    status, body, took = ui_server.get(f"/liftbridge/api/connections/{connections['tls']}")
    assert status == 503, body
    assert json.loads(secret_free(body))["error"]
    assert took < 15, f"{took:.1f} s"
    for path in API_PATHS:
        secret_free(ui_server.get(path)[1])


def test_a_user_who_may_not_read_connections_is_refused(ui_server: UiServer, connections: dict[str, str]) -> None:
    for path in API_PATHS:
        status, body, _ = ui_server.get(path, user="viewer")
        assert status == 403, (path, status, body)
        status, body, _ = ui_server.get(path, user=None)
        assert status == 401, (path, status, body)
        assert "order" not in body


def _signed_in(driver: WebDriver, ui_server: UiServer) -> None:
    """The browser carries the admin's token as the UI's cookie (what Airflow's login sets)."""
    driver.get(f"{ui_server.url}/api/v2/monitor/health")
    driver.delete_all_cookies()
    driver.add_cookie({"name": "_token", "value": ui_server.tokens["admin"], "path": "/"})


def _wait(driver: WebDriver) -> WebDriverWait[WebDriver]:
    """A wait that reads again when the page redrew an element meanwhile (it redraws on every refresh)."""
    return WebDriverWait(driver, WAIT, ignored_exceptions=[StaleElementReferenceException])


def _text(driver: WebDriver, xpath: str) -> str:
    """The text of the element at ``xpath`` once it is visible (read again if the page redrew it)."""
    return str(
        _wait(driver).until(
            lambda d: d.find_element(By.XPATH, xpath).is_displayed() and d.find_element(By.XPATH, xpath).text
        )
    )


def _screenshot(driver: WebDriver, name: str) -> None:
    path = ARTIFACTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), path
    print(f"screenshot: {path}")


def _tab(driver: WebDriver, name: str) -> None:
    driver.find_element(By.XPATH, f"//button[@role='tab'][normalize-space()='{name}']").click()


def test_the_page_in_airflows_navigation_shows_streams_cursor_lag_and_watchers(
    browser: WebDriver, ui_server: UiServer, connections: dict[str, str]
) -> None:
    _signed_in(browser, ui_server)
    browser.get(f"{ui_server.url}/")
    link = _wait(browser).until(ec.presence_of_element_located((By.XPATH, "//a[contains(@href, 'liftbridge')]")))
    assert "liftbridge" in (link.get_attribute("href") or "")
    browser.get(f"{ui_server.url}/plugin/liftbridge")
    frame = _wait(browser).until(ec.presence_of_element_located((By.XPATH, "//iframe[contains(@src, 'liftbridge')]")))
    browser.switch_to.frame(frame)
    try:
        select = _wait(browser).until(ec.presence_of_element_located((By.ID, "lb-connection")))
        _wait(browser).until(lambda _: "lb_page" in select.text)
        browser.execute_script(
            "arguments[0].value = 'lb_page'; arguments[0].dispatchEvent(new Event('change'))", select
        )
        row = f"//tr[@data-testid='stream-row'][@data-stream='{STREAM}']"
        _wait(browser).until(lambda d: len(d.find_elements(By.XPATH, row)) == 3)
        assert _text(browser, f"{row}[@data-partition='0']/td[5]") == "9"  # the high watermark
        assert _text(browser, f"{row}[@data-partition='0']/td[6]") == "9"  # the newest offset
        browser.switch_to.default_content()
        _screenshot(browser, "page-streams")
        browser.switch_to.frame(frame)

        _tab(browser, "Cursors")
        cursor_row = f"//tr[@data-testid='cursor-row'][@data-cursor='{CURSOR}']"
        assert _text(browser, f"{cursor_row}[@data-partition='0']//span[contains(@class, 'lag')]") == "4"
        assert _text(browser, f"{cursor_row}[@data-partition='2']//span[contains(@class, 'lag')]") == "1"
        browser.switch_to.default_content()
        _screenshot(browser, "page-cursors")
        browser.switch_to.frame(frame)

        _tab(browser, "Watchers")
        watcher = _wait(browser).until(
            ec.visibility_of_element_located(
                (By.XPATH, "//tr[@data-testid='watcher-row'][@data-watcher='orders_watcher']")
            )
        )
        assert "ValueError: no customer id" in watcher.text
        assert f"1 in {DLQ}" in watcher.text
        browser.switch_to.default_content()
        _screenshot(browser, "page-watchers")
    finally:
        browser.switch_to.default_content()


def test_a_broker_stopped_under_an_open_page_shows_the_error(
    browser: WebDriver, ui_server: UiServer, connections: dict[str, str]
) -> None:
    with start_single() as node:
        with LiftbridgeClient(node.brokers) as client:
            client.create_stream("payments", "payments", partitions=2)
        ui_server.add_connection("lb_page_stop", node.brokers[0])
        _signed_in(browser, ui_server)
        browser.get(f"{ui_server.url}/liftbridge/?conn=lb_page_stop")
        rows = "//tr[@data-testid='stream-row'][@data-stream='payments']"
        _wait(browser).until(lambda d: len(d.find_elements(By.XPATH, rows)) == 2)
        node.stop()
        stopped = time.monotonic()
    error = _text(browser, "//*[@id='lb-error']")
    shown = time.monotonic() - stopped
    assert f"Liftbridge at {node.brokers[0]} did not answer within" in error, error
    print(f"error shown {shown:.1f} s after the broker stopped")
    _screenshot(browser, "page-broker-down")


INGEST_JOB = Path(__file__).resolve().parents[2] / "spark_jobs" / "ingest.py"


def test_a_real_ingest_run_shows_in_the_runs_view_with_rows_per_range_and_its_dag_runs_link(
    browser: WebDriver, ui_server: UiServer, connections: dict[str, str], page_node: DevServer, tmp_path: Path
) -> None:
    """`airflow dags test` of freeze, wait, spark-submit of spark_jobs/ingest.py and commit, on 2 x 25 messages:
    the Runs view lists the run with 25 rows per range read from the lake's claim ledger, and links its page."""
    stream, lake = "clicks", tmp_path / "lake"
    with LiftbridgeClient(page_node.brokers) as client:
        client.create_stream(stream, stream, partitions=2)
        messages = [PublishMessage(f"c{i}".encode(), partition=i % 2) for i in range(50)]
        client.publish_batch(stream, messages, ack_policy="all")
    body = f"""
        from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

        freeze = LiftbridgeOffsetRangesOperator(task_id="freeze", stream={stream!r}, cursor_id="lake")
        wait = LiftbridgePartitionOffsetSensor(task_id="wait", ranges=freeze.output, poke_interval=1, timeout=60)
        spark = SparkSubmitOperator(
            task_id="ingest",
            application={str(INGEST_JOB)!r},
            conf={{"spark.pyspark.python": {sys.executable!r}, "spark.ui.enabled": "false"}},
            application_args=[
                "--brokers", {",".join(page_node.brokers)!r},
                "--ranges", "{{{{ ti.xcom_pull(task_ids='freeze') | tojson }}}}",
                "--output", {str(lake)!r},
            ],
        )
        commit = LiftbridgeCommitCursorOperator(task_id="commit", ranges=freeze.output)
        freeze >> wait >> spark >> commit
    """
    env = connection_env(page_node) | {
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    began = time.monotonic()
    run = run_dag(ui_server.home, body, env)
    print(f"the DAG run took {time.monotonic() - began:.0f} s")
    assert run.ok(), run.output[-4000:]
    assert run.run_id is not None

    status, text, _ = ui_server.get("/liftbridge/api/runs")
    assert status == 200, text
    ours = [r for r in json.loads(text)["runs"] if r["dag_id"] == run.dag_id]
    assert len(ours) == 1, text
    (row,) = ours
    assert (row["run_id"], row["task_id"], row["state"], row["format"], row["lake"]) == (
        run.run_id, "ingest", "success", "parquet", str(lake)
    )  # fmt: skip
    assert [(r["partition"], r["start"], r["end"], r["rows"], r["whole"]) for r in row["ranges"]] == [
        (0, 0, 25, 25, True),
        (1, 0, 25, 25, True),
    ]
    assert row["total_rows"] == 50
    assert row["error"] is None
    status, _, _ = ui_server.get("/liftbridge/api/runs", user="viewer")
    assert status == 403

    _signed_in(browser, ui_server)
    browser.get(f"{ui_server.url}/plugin/liftbridge")
    frame = _wait(browser).until(ec.presence_of_element_located((By.XPATH, "//iframe[contains(@src, 'liftbridge')]")))
    browser.switch_to.frame(frame)
    try:
        _wait(browser).until(ec.presence_of_element_located((By.ID, "lb-connection")))
        _tab(browser, "Runs")
        run_row = f"//tr[@data-testid='run-row'][@data-dag='{run.dag_id}']"
        first = _text(browser, f"{run_row}//li[@data-testid='run-range'][@data-partition='0']")
        assert first == "p0 [0, 25): 25 row(s) in 1 piece(s)", first
        link = browser.find_element(By.XPATH, f"{run_row}//a")
        assert link.text == run.run_id
        href = link.get_attribute("href") or ""
        assert href.startswith(f"{ui_server.url}/dags/{run.dag_id}/runs/"), href
        browser.switch_to.default_content()
        _screenshot(browser, "page-runs")
        browser.get(href)  # the DAG run's page in Airflow's UI (the link opens it in the whole window)
        run_id = run.run_id
        _wait(browser).until(lambda d: run_id in d.find_element(By.TAG_NAME, "body").text)
    finally:
        browser.switch_to.default_content()


def test_the_cursors_lag_over_time_is_drawn_from_the_samples_the_page_took(
    browser: WebDriver, ui_server: UiServer, connections: dict[str, str]
) -> None:
    _signed_in(browser, ui_server)
    browser.get(f"{ui_server.url}/liftbridge/?conn=lb_page")
    _tab(browser, "Cursors")
    chart = f"//h2[starts-with(normalize-space(), '{CURSOR} on {STREAM}')]/following-sibling::div[1]"
    line = f"{chart}//*[local-name()='polyline'][@data-partition='0']"
    _wait(browser).until(lambda d: len((d.find_element(By.XPATH, line).get_attribute("points") or "").split()) >= 2)
    _status, text, _ = ui_server.get("/liftbridge/api/connections/lb_page/cursors")
    drawn = next(r for r in json.loads(text)["cursors"]["rows"] if r["cursor_id"] == CURSOR)["chart"]
    assert drawn["top"] == 4
    assert {ln["partition"]: ln["lag"] for ln in drawn["lines"]} == {0: 4, 1: 0, 2: 1}
    _screenshot(browser, "page-lag-history")
