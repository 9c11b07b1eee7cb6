"""An actor's inference + simulation loop, without sockets: one fragment at a time.

Used by the actor role (which adds pushing, parameter probes and pacing) and
by the profiler and throughput benchmark (which time it), so what is measured
is exactly what actors run.

Per step t of a fragment, for N envs (Gymnasium NEXT_STEP autoreset):
obs[t], the action, the reward (sign() when the env asks for clipped
rewards), done/terminated, valid[t] = not done[t-1] (the step after a done is
a reset step whose action the env ignores), and for PPO the behaviour log-prob.
"""
from __future__ import annotations

import numpy as np

from tianji.algos import dqn, ppo
from tianji.envs import env_info, make_vec_env
from tianji.algos.models import build_model
from tianji.control.spec import JobSpec


class Rollout:
    def __init__(self, spec: JobSpec, seed: int, frames_scale: int = 1):
        """`frames_scale`: actors sharing the exploration schedule (own frames × this ≈ global frames)."""
        self.spec = spec
        self.algo = spec.algorithm.name
        self.env = make_vec_env(spec.env)
        self.info = env_info(self.env)
        self.model = build_model(self.algo, spec.model, self.info, spec.env.seed)
        self.model.eval()
        self.rng = np.random.default_rng(seed)
        self.obs, _ = self.env.reset(seed=seed)
        self.n, self.T = self.env.num_envs, spec.env.fragment_length
        self.prev_done = np.zeros(self.n, dtype=bool)
        self.ep_return = np.zeros(self.n, dtype=np.float64)
        self.clip_rewards = bool(getattr(self.env, "clip_rewards", False))
        self.frames = 0
        self.frames_scale = frames_scale
        self.global_frames = 0  # the learner's count (published with its parameters)

    def epsilon(self) -> float:
        """DQN exploration now. The learner's count lags by a publish and counts only frames that
        reached a buffer; before its first publish this actor's own frames x actors stand in."""
        return dqn.epsilon(self.spec.algorithm, max(self.global_frames, self.frames * self.frames_scale))

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, dict]:
        if self.algo == "ppo":
            return ppo.act(self.model, obs, self.rng)
        return dqn.act(self.model, obs, self.epsilon(), self.rng, self.info.n_actions)

    def _new_fragment(self) -> dict[str, np.ndarray]:
        """Fresh arrays per fragment: a zero-copy send may still own the previous ones."""
        T, n = self.T, self.n
        buf = {"obs": np.empty((T, n, *self.info.obs_shape), dtype=self.obs.dtype),
               "actions": np.empty((T, n), dtype=np.int64), "rewards": np.empty((T, n), dtype=np.float32),
               "dones": np.empty((T, n), dtype=bool), "terminated": np.empty((T, n), dtype=bool),
               "valid": np.empty((T, n), dtype=bool)}
        if self.algo == "ppo":
            buf["logp"] = np.empty((T, n), dtype=np.float32)
        return buf

    @staticmethod
    def _episode_ends(done: np.ndarray, info) -> np.ndarray:
        """Real episode ends (with episodic life, a lost life is a `done` but not an episode end)."""
        real = info.get("episode_end") if isinstance(info, dict) else None
        return np.asarray(real, dtype=bool) if real is not None else done

    def fragment(self) -> tuple[dict[str, np.ndarray], list[float]]:
        """Step T times. Returns the fragment's arrays (`last_obs` is `self.obs` after it) and
        the raw returns of the episodes that ended during it."""
        buf = self._new_fragment()
        finished: list[float] = []
        for t in range(self.T):
            obs = self.obs
            actions, extra = self.act(obs)
            next_obs, reward, term, trunc, info = self.env.step(actions)
            done = np.asarray(term) | np.asarray(trunc)
            buf["obs"][t] = obs
            buf["actions"][t] = actions
            buf["valid"][t] = ~self.prev_done
            buf["dones"][t] = done
            buf["terminated"][t] = term
            raw = np.asarray(reward, dtype=np.float64)
            self.ep_return += raw
            buf["rewards"][t] = np.sign(raw) if self.clip_rewards else raw
            if "logp" in extra:
                buf["logp"][t] = extra["logp"]
            ended = self._episode_ends(done, info)
            if ended.any():
                finished.extend(self.ep_return[ended].tolist())
                self.ep_return[ended] = 0.0
            self.prev_done, self.obs = done, next_obs
            self.frames += self.n
        return buf, finished

    def close(self) -> None:
        self.env.close()
