"""A site's directory (knowledge.SiteHome): its files by name, opened under the policy file as it is
now."""

from __future__ import annotations

import pytest

import knowledge
from knowledge import PolicyError, SiteHome, StoreError, StoreLockedError


@pytest.fixture
def site(tmp_path):
    """A site directory whose store holds one skill with one 100-branch certificate."""
    home = SiteHome(tmp_path)
    identity = knowledge.Identity.generate()
    identity.save(home.key)
    with knowledge.open(home.store, identity) as kb:
        skill = kb.skills.publish("pick-mug", "pick")
        kb.certificates.add(skill.id, branches=100, successes=100)
    home.policy.write_text("[activation]\nrerunnable_only = false\n")  # a typed-in certificate
    return home, skill.id


def test_files_by_name(tmp_path):
    home = SiteHome(tmp_path)
    assert (home.store, home.key, home.policy) == (
        tmp_path / "site.db",
        tmp_path / "site.key",
        tmp_path / "trust.toml",
    )


def test_a_reader_judges_by_the_policy_file_as_it_is_now(site):
    home, skill_id = site
    with home.open_readonly() as kb:
        assert kb.is_active(skill_id)
    home.policy.write_text("[activation]\nmin_branches = 500\nrerunnable_only = false\n")
    with home.open_readonly() as kb:
        assert not kb.is_active(skill_id)
    with home.open_writer() as kb:
        assert not kb.is_active(skill_id)


def test_a_broken_policy_file_is_an_error_for_readers_and_writers(site):
    home, _ = site
    home.policy.write_text("[activation\n")
    with pytest.raises(PolicyError):
        home.open_readonly()
    with pytest.raises(PolicyError):
        home.open_writer()


def test_no_store_says_how_to_make_one(tmp_path):
    with pytest.raises(StoreError, match="simnet init"):
        SiteHome(tmp_path / "nowhere").open_readonly()


def test_one_writer_at_a_time(site):
    home, _ = site
    with home.open_writer(), pytest.raises(StoreLockedError):
        home.open_writer()
