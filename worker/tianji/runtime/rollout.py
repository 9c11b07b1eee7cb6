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
from tianji.algos.distributions import clip_to_bounds
from tianji.algos.models import build_model
from tianji.control.spec import JobSpec
from tianji.envs import check_declared, env_info, make_vec_env, split
from tianji.runtime.onnxpolicy import PolicyRuntime


class Rollout:
    def __init__(self, spec: JobSpec, seed: int, frames_scale: int = 1, background_choice: bool = False,
                 wait_swaps: bool = False):
        """`frames_scale`: actors sharing the exploration schedule (own frames × this ≈ global frames).
        `background_choice`, `wait_swaps`: how the inference runtime is chosen and follows new
        versions (onnxpolicy.PolicyRuntime: an actor decides on a thread; an on-policy one waits for a
        new version's session at the next fragment's start)."""
        self.spec = spec
        self.algo = spec.algorithm.name
        self.env = make_vec_env(spec.env, halves=split.wanted(spec.resources.actor.cpu))
        self.info = env_info(self.env)
        check_declared(spec.env, self.info)
        self.model = build_model(spec.algorithm, spec.model, self.info, spec.env.seed, spec.env.imports)
        self.model.eval()
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.reset()
        one_call = self.env.slices[0] if hasattr(self.env, "halves") else slice(None)  # double buffering: half
        calls = spec.env.fragment_length * (len(self.env.slices) if hasattr(self.env, "halves") else 1)
        self.runtime = PolicyRuntime(self.model, spec, self.obs[one_call], background=background_choice,
                                     wait_swaps=wait_swaps, forwards_per_swap=calls)
        self.n, self.T = self.env.num_envs, spec.env.fragment_length
        self.clip_rewards = bool(getattr(self.env, "clip_rewards", False))
        self.frames = 0
        self.frames_scale = frames_scale
        self.global_frames = 0  # the learner's count (published with its parameters)
        if self.info.continuous:  # actions are stored unclipped; env.step gets them clipped to the Box
            self.act_low = np.asarray(self.info.act_low, dtype=np.float32)
            self.act_high = np.asarray(self.info.act_high, dtype=np.float32)

    def reset(self) -> None:
        """Start every env afresh (also after an env produced non-finite observations)."""
        self.obs, _ = self.env.reset(seed=self.seed)
        self.seed += 1_000_003  # a later reset must not replay the same episodes
        self.prev_done = np.zeros(self.env.num_envs, dtype=bool)
        self.ep_return = np.zeros(self.env.num_envs, dtype=np.float64)
        self.ep_length = np.zeros(self.env.num_envs, dtype=np.int64)  # valid steps (a reset step is none)

    def epsilon(self) -> float:
        """DQN exploration now. The learner's count lags by a publish and counts only frames that
        reached a buffer; before its first publish this actor's own frames x actors stand in."""
        return dqn.epsilon(self.spec.algorithm, max(self.global_frames, self.frames * self.frames_scale))

    @property
    def policy(self):
        """What act() runs: the model, its bf16 copy or its ONNX Runtime session (onnxpolicy.py)."""
        return self.runtime.policy

    @property
    def acting_version(self) -> int:
        """The policy version the last fragment acted with throughout."""
        return self.runtime.version

    def params_loaded(self, version: int = 0) -> None:
        """Call after loading new parameters (version `version`) into `self.model`: the acting copy
        (bf16, or ONNX Runtime's, from the next fragment on) follows."""
        self.runtime.loaded(version)

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, dict]:
        if self.algo == "ppo":
            return ppo.act(self.policy, obs, self.rng)
        return dqn.act(self.policy, obs, self.epsilon(), self.rng, self.info.n_actions)

    def _new_fragment(self) -> dict[str, np.ndarray]:
        """Fresh arrays per fragment: a zero-copy send may still own the previous ones."""
        T, n = self.T, self.n
        buf = {"obs": np.empty((T, n, *self.info.obs_shape), dtype=self.obs.dtype),
               "actions": np.empty((T, n, *self.info.act_shape),
                                   dtype=np.float32 if self.info.continuous else np.int64),
               "rewards": np.empty((T, n), dtype=np.float32),
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

    def fragment(self) -> tuple[dict[str, np.ndarray], list[tuple[float, int]]]:
        """Step T times. Returns the fragment's arrays (`last_obs` is `self.obs` after it) and
        the raw return and the length (steps) of each episode that ended during it."""
        self.runtime.begin_fragment()
        if hasattr(self.env, "halves"):
            return self._fragment_double_buffered()
        buf = self._new_fragment()
        finished: list[tuple[float, int]] = []
        for t in range(self.T):
            obs = self.obs
            actions, extra = self.act(obs)
            env_actions = clip_to_bounds(actions, self.act_low, self.act_high) if self.info.continuous else actions
            next_obs, reward, term, trunc, info = self.env.step(env_actions)
            done = np.asarray(term) | np.asarray(trunc)
            buf["obs"][t] = obs
            buf["actions"][t] = actions
            buf["valid"][t] = ~self.prev_done
            buf["dones"][t] = done
            buf["terminated"][t] = term
            raw = np.asarray(reward, dtype=np.float64)
            self.ep_return += raw
            self.ep_length += ~self.prev_done
            buf["rewards"][t] = np.sign(raw) if self.clip_rewards else raw
            if "logp" in extra:
                buf["logp"][t] = extra["logp"]
            ended = self._episode_ends(done, info)
            if ended.any():
                finished.extend(zip(self.ep_return[ended].tolist(), self.ep_length[ended].tolist()))
                self.ep_return[ended], self.ep_length[ended] = 0.0, 0
            self.prev_done, self.obs = done, next_obs
            self.frames += self.n
        return buf, finished

    def _fragment_double_buffered(self) -> tuple[dict[str, np.ndarray], list[tuple[float, int]]]:
        """As fragment(), with the policy for one half of the envs computed while the other half
        steps in ALE's threads (envs/split.py). Each env's transitions are those of fragment()."""
        buf = self._new_fragment()
        finished: list[tuple[float, int]] = []
        self.obs = self.obs.copy()  # updated in place below; the previous fragment's last_obs may be in flight
        halves, slices = self.env.halves, self.env.slices

        def launch(h: int, t: int) -> None:
            s = slices[h]
            obs = self.obs[s]
            actions, extra = self.act(obs)
            buf["obs"][t, s] = obs
            buf["actions"][t, s] = actions
            if "logp" in extra:
                buf["logp"][t, s] = extra["logp"]
            halves[h].send(actions)

        def land(h: int, t: int) -> None:
            s = slices[h]
            next_obs, reward, term, trunc, info = halves[h].recv()
            done = np.asarray(term) | np.asarray(trunc)
            buf["valid"][t, s] = ~self.prev_done[s]
            buf["dones"][t, s] = done
            buf["terminated"][t, s] = term
            raw = np.asarray(reward, dtype=np.float64)
            ret, length = self.ep_return[s], self.ep_length[s]
            ret += raw
            length += ~self.prev_done[s]
            buf["rewards"][t, s] = np.sign(raw) if self.clip_rewards else raw
            ended = self._episode_ends(done, info)
            if ended.any():
                finished.extend(zip(ret[ended].tolist(), length[ended].tolist()))
                ret[ended], length[ended] = 0.0, 0
            self.prev_done[s] = done
            self.obs[s] = next_obs
            self.frames += s.stop - s.start

        for t in range(self.T):
            for h in range(len(halves)):
                if t > 0:
                    land(h, t - 1)
                launch(h, t)
        for h in range(len(halves)):
            land(h, self.T - 1)
        return buf, finished

    def close(self) -> None:
        self.runtime.close()
        self.env.close()
