"""One rule for a server's URL, whichever face takes it: `run` / the trainer API / `calibrate`
(`parse_urls`) and the router (`--workers`, its admin endpoint) accept and refuse the same URLs."""

import pytest

from cadencerl.config import ConfigError
from cadencerl.router.settings import make_settings
from cadencerl.runs.real import parse_urls

GOOD = [("http://127.0.0.1:8000/", "http://127.0.0.1:8000"), ("http://[::1]:8000", "http://[::1]:8000"),
        ("https://gpu0.example", "https://gpu0.example"), ("http://gw:80/vllm0/", "http://gw:80/vllm0")]
BAD = [("http://h:99999", "1-65535"), ("http://h:0", "1-65535"), ("http://h:x", "1-65535"),
       ("ftp://h:21", "http(s)"), ("h:8000", "http(s)"), ("http://:8000", "http(s)"), ("http://a b:80", "http(s)"),
       ("http://h:8000?x=1", "without a query"), ("http://h:8000/?", "without a query"),
       ("http://h:8000#", "without a query"), ("http://u:p@h:8000", "without a query"),
       ("http://h:8000/v1", "without /v1"), ("http://h:8000/v1/", "without /v1")]


@pytest.mark.parametrize("url, kept", GOOD)
def test_both_faces_keep_a_good_url_without_its_trailing_slash(url, kept):
    assert parse_urls(url) == [kept]
    assert make_settings(workers=[url]).workers == [kept]


@pytest.mark.parametrize("url, why", BAD)
def test_both_faces_refuse_a_bad_url_naming_the_field_and_why(url, why):
    with pytest.raises(ConfigError, match="^workers:") as run_error:
        parse_urls(url)
    with pytest.raises(ConfigError, match="workers") as router_error:
        make_settings(workers=[url])
    assert why in str(run_error.value) and why in str(router_error.value)
