"""Advantage actor-critic (A2C) as GPU-simulation RL code writes it: thousands of point-mass environments
simulated together in torch tensors on the GPU, an actor (an MLP giving a Gaussian policy,
`torch.distributions.Normal`) and a critic (an MLP) as two modules with an Adam optimizer each; every update
rolls the environments forward under `no_grad` — actor, critic and physics each step, into preallocated
buffers — computes generalized advantages in a loop over the horizon, then takes one step of each
optimizer on the whole rollout. Float32; the mean reward read with `.item()` every 10 updates.
`--expert`: the rollout step (policy, value, physics), the advantage loop and the losses compiled (one backward through both losses), the
distribution built without argument validation (which synchronizes twice per step), TF32, fused Adam."""

import argparse

import torch
from torch import nn
from torch.distributions import Normal

parser = argparse.ArgumentParser()
parser.add_argument("--updates", type=int, default=1_000_000)
parser.add_argument("--envs", type=int, default=4096)
parser.add_argument("--horizon", type=int, default=64)
parser.add_argument(
    "--small", action="store_true", help="a few environments, a short horizon (CPU smoke test)"
)
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

N_ENVS, HORIZON = (64, 8) if args.small else (args.envs, args.horizon)
OBS, ACT, HIDDEN = 7, 2, 64 if args.small else 256
GAMMA, LAMBDA, DT = 0.99, 0.95, 0.05
device = "cuda" if torch.cuda.is_available() else "cpu"
if args.expert:
    torch.set_float32_matmul_precision("high")
    torch.distributions.Distribution.set_default_validate_args(False)


class PointMasses:
    """Point masses pushed towards goals on a plane: observation (position, velocity, offset to the goal,
    time left), reward the negative distance less an effort cost; an episode ends at the goal or after
    200 steps, and starts again at once."""

    def __init__(self, n):
        self.n = n
        self.pos, self.vel = torch.zeros(n, 2, device=device), torch.zeros(n, 2, device=device)
        self.goal, self.t = torch.zeros(n, 2, device=device), torch.zeros(n, device=device)
        self.reset(torch.ones(n, dtype=torch.bool, device=device))

    def reset(self, done):
        keep = ~done[:, None]
        self.pos = torch.where(keep, self.pos, torch.rand(self.n, 2, device=device) * 4 - 2)
        self.vel = torch.where(keep, self.vel, torch.zeros_like(self.vel))
        self.goal = torch.where(keep, self.goal, torch.rand(self.n, 2, device=device) * 4 - 2)
        self.t = torch.where(done, torch.zeros_like(self.t), self.t)

    def observe(self):
        return torch.cat([self.pos, self.vel, self.goal - self.pos, 1 - self.t[:, None] / 200], dim=1)

    def step(self, action):
        force = action.clamp(-1, 1)
        self.vel = 0.9 * self.vel + DT * force
        self.pos = (self.pos + DT * self.vel).clamp(-2, 2)
        self.t = self.t + 1
        distance = (self.goal - self.pos).norm(dim=1)
        reward = -distance - 0.01 * (force**2).sum(1)
        done = (distance < 0.05) | (self.t >= 200)
        self.reset(done)
        return self.observe(), reward, done


def mlp(out):
    return nn.Sequential(
        nn.Linear(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, out)
    )


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.mean = mlp(ACT)
        self.log_std = nn.Parameter(torch.full((ACT,), -0.5))

    def forward(self, obs):
        return Normal(self.mean(obs), self.log_std.exp())


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.value = mlp(1)

    def forward(self, obs):
        return self.value(obs).squeeze(-1)


env = PointMasses(N_ENVS)
actor, critic = Actor().to(device), Critic().to(device)
actor_optimizer = torch.optim.Adam(actor.parameters(), lr=3e-4, fused=True if args.expert else None)
critic_optimizer = torch.optim.Adam(critic.parameters(), lr=1e-3, fused=True if args.expert else None)
observations = torch.zeros(HORIZON, N_ENVS, OBS, device=device)
actions = torch.zeros(HORIZON, N_ENVS, ACT, device=device)
rewards, dones, values = (torch.zeros(HORIZON, N_ENVS, device=device) for _ in range(3))


def act(obs):
    action = actor(obs).sample()
    value = critic(obs)
    next_obs, reward, done = env.step(action)
    return action, value, next_obs, reward, done


def advantages(rewards, values, dones, last_value):
    advantage = torch.zeros_like(rewards)
    gae = torch.zeros_like(last_value)
    for t in reversed(range(HORIZON)):
        next_value = last_value if t == HORIZON - 1 else values[t + 1]
        not_done = 1.0 - dones[t]
        delta = rewards[t] + GAMMA * next_value * not_done - values[t]
        gae = delta + GAMMA * LAMBDA * not_done * gae
        advantage[t] = gae
    return advantage


def losses(observations, actions, advantage, returns):
    policy = actor(observations)
    log_prob = policy.log_prob(actions).sum(-1)
    normalized = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    actor_loss = -(log_prob * normalized).mean() - 0.01 * policy.entropy().sum(-1).mean()
    critic_loss = nn.functional.mse_loss(critic(observations), returns)
    return actor_loss, critic_loss


if args.expert and device == "cuda":  # Inductor on the CPU needs a C++ toolchain: the smoke test runs eager
    act, advantages, losses = torch.compile(act), torch.compile(advantages), torch.compile(losses)

obs = env.observe()
for update in range(args.updates):
    with torch.no_grad():
        for t in range(HORIZON):
            observations[t] = obs
            action, value, obs, reward, done = act(obs)
            actions[t], values[t], rewards[t], dones[t] = action, value, reward, done
        advantage = advantages(rewards, values, dones, critic(obs))
        returns = advantage + values
    actor_loss, critic_loss = losses(observations.flatten(0, 1), actions.flatten(0, 1), advantage.flatten(),
                                     returns.flatten())  # fmt: skip
    if args.expert:  # one backward through the compiled losses' graph
        actor_optimizer.zero_grad()
        critic_optimizer.zero_grad()
        (actor_loss + critic_loss).backward()
        actor_optimizer.step()
        critic_optimizer.step()
    else:
        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()
        critic_optimizer.zero_grad()
        critic_loss.backward()
        critic_optimizer.step()
    if update % 10 == 0:
        print(f"update {update} mean reward {rewards.mean().item():.3f}")
