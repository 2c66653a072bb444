"""`python -m stacks.pick_az` against an EC2-compatible server (moto, server mode, loopback): boto3's
real request and pagination code runs; the offerings are moto 5.2.5's copy of EC2's per-zone data."""

from __future__ import annotations

import pytest

from stacks.pick_az import main

FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@pytest.fixture
def pick(moto_endpoint, monkeypatch, capsys):
    for key, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(key, value)

    def run(*args: str) -> tuple[int, str, str]:
        code = main(["--endpoint-url", moto_endpoint, *args])
        out, err = capsys.readouterr()
        return code, out, err
    return run


def test_prints_the_zones_offering_every_type_and_the_option_to_pass(pick):
    code, out, err = pick("--region", "us-west-2", "--instance-types", "p5.48xlarge,g4dn.12xlarge")
    assert (code, err) == (0, "")
    # p5.48xlarge is offered in us-west-2a..d, g4dn.12xlarge in a..c: d is left out.
    assert out.splitlines() == [
        "zones of us-west-2 offering p5.48xlarge, g4dn.12xlarge: us-west-2a, us-west-2b, us-west-2c",
        "suggested (the first; any of them works): -c region=us-west-2 -c network.availability_zone=us-west-2a"]


def test_a_type_offered_in_one_zone_only_decides(pick):
    code, out, _ = pick("--region", "us-west-2", "--instance-types", "trn1n.32xlarge, p5.48xlarge")
    assert code == 0 and "offering trn1n.32xlarge, p5.48xlarge: us-west-2d\n" in out


@pytest.mark.parametrize("types, where", [
    ("trn1n.32xlarge,g4dn.12xlarge", "trn1n.32xlarge in us-west-2d; g4dn.12xlarge in us-west-2a, us-west-2b, us-west-2c"),
    ("p5.48xlarge,g9x.nosuch", "g9x.nosuch in no zone"),
])
def test_no_common_zone_is_one_line_naming_where_each_type_is(pick, types, where):
    code, out, err = pick("--region", "us-west-2", "--instance-types", types)
    assert (code, out) == (1, "")
    assert err.startswith("error: no availability zone of us-west-2 offers all of ") and where in err
    assert err.count("\n") == 1


def test_an_unreachable_endpoint_is_one_line(monkeypatch, capsys):
    for key, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    code = main(["--region", "us-west-2", "--instance-types", "p5.48xlarge", "--endpoint-url", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: cannot ask EC2 in us-west-2: ") and err.count("\n") == 1


def test_an_empty_type_list_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--region", "us-west-2", "--instance-types", " , "])
    assert stop.value.code == 2 and "name at least one instance type" in capsys.readouterr().err
