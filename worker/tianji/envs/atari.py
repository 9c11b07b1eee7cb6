"""Atari (ALE) vector environments with the standard DQN preprocessing.

`make_atari_vec(cfg, n)` returns a Gymnasium VectorEnv whose observations are
uint8 [frame_stack, 84, 84] per env, with (Mnih et al. 2015; Machado et al. 2018):

- up to 30 no-op actions at reset, FIRE at reset for games that need it;
- frame skip 4, max-pool over the last 2 raw frames, 84x84 grayscale;
- a stack of the last `cfg.frame_stack` frames (zero-padded after a reset);
- the minimal action set (full action space off);
- repeat_action_probability 0 (no sticky actions) also for `-v5` ids, so
  results compare with the Nature-DQN / CleanRL literature, which used
  `NoFrameskip-v4` (the only difference between the two ids here);
- truncation after 108,000 emulator frames (30 minutes of play);
- raw (unclipped) rewards. `env.clip_rewards` (= cfg.clip_rewards) tells the
  actor to learn from sign(reward) while it tracks the raw return.

Backends: ale-py's native C++ vector env (`ale_py.vector_env.AtariVectorEnv`)
when importable, else Gymnasium's `AtariPreprocessing` + `FrameStackObservation`
in a `SyncVectorEnv`. The native one is several times faster per core (see
bench/throughput.py); `TIANJI_ATARI_BACKEND=gymnasium` forces the fallback and
`TIANJI_ALE_THREADS` sets the native env's worker threads (default 1: an actor
process is planned as at most one core).

Autoreset is Gymnasium's NEXT_STEP: the step after a `done` returns the reset
observation, reward 0, not done, and ignores its action (roles/actor.py marks
it invalid).

Episodic life (`cfg.episodic_life`): a lost life is reported as `terminated`
(learning treats it as the end of an episode) while the game goes on, and
`info["episode_end"]` (bool [n]) marks the real game ends (terminated or
truncated at game over) for episode counting. The step after a life loss
behaves like a NEXT_STEP reset step: its action is replaced (FIRE for games
whose second action is FIRE, else NOOP, as DeepMind's EpisodicLife+FireReset
wrappers do) so "the step after a done ignores the action" holds for both kinds
of done.
"""
from __future__ import annotations

import os
import re
from typing import Any, Optional

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from tianji.control.spec import EnvConfig
from tianji.envs import seeding

SCREEN = 84
FRAME_SKIP = 4
NOOP_MAX = 30
MAX_EPISODE_FRAMES = 108_000
REPEAT_ACTION_PROBABILITY = 0.0


def _register() -> None:
    import ale_py

    gym.register_envs(ale_py)


def rom_name(env_id: str) -> str:
    """`ALE/Pong-v5`, `PongNoFrameskip-v4` → `pong`; `ALE/MsPacman-v5` → `ms_pacman`."""
    _register()
    try:
        game = gym.spec(env_id).kwargs.get("game")
    except gym.error.Error as e:
        raise ValueError(f"env.id {env_id!r}: {e}") from None
    if isinstance(game, str) and game:
        return game
    base = env_id.split("/")[-1].split("-")[0].replace("NoFrameskip", "").replace("Deterministic", "")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", base).lower()


def backend() -> str:
    want = os.environ.get("TIANJI_ATARI_BACKEND", "").strip().lower()
    if want in ("gymnasium", "gym", "sync"):
        return "gymnasium"
    try:
        from ale_py.vector_env import AtariVectorEnv  # noqa: F401
    except ImportError:
        if want == "native":
            raise
        return "gymnasium"
    return "native"


# ----------------------------------------------------------------- backends
def _native(cfg: EnvConfig, n: int) -> VectorEnv:
    from ale_py.vector_env import AtariVectorEnv

    threads = int(os.environ.get("TIANJI_ALE_THREADS", "1") or 1)
    return AtariVectorEnv(
        rom_name(cfg.id), n, num_threads=max(1, min(threads, n)),
        max_num_frames_per_episode=MAX_EPISODE_FRAMES, repeat_action_probability=REPEAT_ACTION_PROBABILITY,
        full_action_space=False, autoreset_mode=AutoresetMode.NEXT_STEP,
        img_height=SCREEN, img_width=SCREEN, grayscale=True, stack_num=cfg.frame_stack,
        frameskip=FRAME_SKIP, maxpool=True, noop_max=NOOP_MAX,
        episodic_life=False,  # native episodic life resets the whole game per life: we track lives ourselves
        life_loss_info=False, reward_clipping=False, use_fire_reset=True,
    )


class _FireReset(gym.Wrapper):
    """Press FIRE after reset for games that wait for it (as the native env's use_fire_reset)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        obs, _, term, trunc, info = self.env.step(1)
        if term or trunc:
            obs, info = self.env.reset(**kwargs)
        return obs, info


def _gym_single(env_id: str, stack: int):
    _register()
    env = gym.make(env_id, frameskip=1, repeat_action_probability=REPEAT_ACTION_PROBABILITY,
                   full_action_space=False, max_num_frames_per_episode=MAX_EPISODE_FRAMES)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN,
                                          terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
    if _has_fire(env.unwrapped.get_action_meanings()):
        env = _FireReset(env)
    return gym.wrappers.FrameStackObservation(env, stack, padding_type="zero")


def _gymnasium(cfg: EnvConfig, n: int) -> VectorEnv:
    fns = [lambda: _gym_single(cfg.id, cfg.frame_stack) for _ in range(n)]
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.NEXT_STEP)


def _has_fire(meanings) -> bool:
    return len(meanings) >= 3 and str(meanings[1]).upper().endswith("FIRE")


# ----------------------------------------------------------------- the actor-facing env
class AtariVec(VectorEnv):
    """Adds reward-clipping flag and episodic-life bookkeeping on top of a backend vector env."""

    def __init__(self, inner: VectorEnv, clip_rewards: bool, episodic_life: bool, backend_name: str,
                 has_fire: bool):
        self.env = inner
        self.num_envs = inner.num_envs
        self.single_observation_space = inner.single_observation_space
        self.single_action_space = inner.single_action_space
        self.observation_space = inner.observation_space
        self.action_space = inner.action_space
        self.metadata = dict(getattr(inner, "metadata", {}) or {}, autoreset_mode=AutoresetMode.NEXT_STEP)
        self.clip_rewards = bool(clip_rewards)
        self.episodic_life = bool(episodic_life)
        self.backend = backend_name
        self.life_reset_action = 1 if has_fire else 0
        self._lives: Optional[np.ndarray] = None
        self._after_life_loss = np.zeros(self.num_envs, dtype=bool)
        self._after_real_done = np.zeros(self.num_envs, dtype=bool)
        self._sent: Optional[np.ndarray] = None

    def reset(self, *, seed: Any = None, options: Optional[dict] = None):
        seeds = seeding.per_env(seed, self.num_envs)  # one plain int per env, as each backend needs (seeding.py)
        if seeds is not None and self.backend == "native":
            seeds = seeding.fit_c_int(seeds)
        obs, info = self.env.reset(seed=seeds, options=options)
        self._lives = self._get_lives(info)
        self._after_life_loss[:] = False
        self._after_real_done[:] = False
        return obs, info

    def _get_lives(self, info: dict) -> Optional[np.ndarray]:
        lives = info.get("lives") if isinstance(info, dict) else None
        return None if lives is None else np.asarray(lives, dtype=np.int64).copy()

    def step(self, actions):
        self.send(actions)
        return self.recv()

    def send(self, actions) -> None:
        """Start a step (native backend: ALE's own threads run it while the caller goes on)."""
        actions = np.asarray(actions, dtype=np.int64)
        if self.episodic_life and self._after_life_loss.any():
            actions = np.where(self._after_life_loss, self.life_reset_action, actions)
        if hasattr(self.env, "send"):
            self.env.send(actions)
            self._sent = None
        else:
            self._sent = actions

    def recv(self):
        """Finish the step started by send()."""
        if self._sent is None:
            obs, reward, term, trunc, info = self.env.recv()
        else:
            obs, reward, term, trunc, info = self.env.step(self._sent)
        term = np.asarray(term, dtype=bool)
        trunc = np.asarray(trunc, dtype=bool)
        if not isinstance(info, dict):
            info = {}
        if self.episodic_life:
            real_done = term | trunc
            lives = self._get_lives(info)
            if lives is not None and self._lives is not None:
                # After a real done this step is the reset step: lives jump back up, not a loss.
                lost = (lives < self._lives) & ~real_done & ~self._after_real_done
            else:
                lost = np.zeros(self.num_envs, dtype=bool)
            self._lives = lives
            self._after_life_loss = lost
            self._after_real_done = real_done
            info = dict(info)
            info["episode_end"] = real_done
            info["life_loss"] = lost
            term = term | lost
        return obs, reward, term, trunc, info

    def close(self, **kwargs):
        return self.env.close(**kwargs)


def make_atari_vec(cfg: EnvConfig, n: int, halves: bool = False) -> VectorEnv:
    """n preprocessed Atari envs for `cfg.id` (e.g. ALE/Pong-v5); see the module docstring.
    `halves` (native backend, n >= 2): two halves that an actor steps double-buffered (envs/split.py)."""
    if n < 1:
        raise ValueError(f"num_envs must be >= 1, got {n}")
    name = backend()
    if name == "native" and n >= 2 and halves:
        from tianji.envs import split

        return split.SplitVec([_make_atari_vec(cfg, n // 2, name), _make_atari_vec(cfg, n - n // 2, name)])
    return _make_atari_vec(cfg, n, name)


def _make_atari_vec(cfg: EnvConfig, n: int, name: str) -> AtariVec:
    inner = _native(cfg, n) if name == "native" else _gymnasium(cfg, n)
    if name == "native":
        from ale_py import Action

        acts = list(inner.ale.get_action_set())
        has_fire = len(acts) >= 3 and acts[1] == Action.FIRE
    else:
        has_fire = _has_fire(inner.envs[0].unwrapped.get_action_meanings())
    return AtariVec(inner, cfg.clip_rewards, cfg.episodic_life, name, has_fire)
