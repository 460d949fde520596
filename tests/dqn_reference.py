"""Double DQN targets in plain numpy: the oracle the learner's TensorFlow step is checked against."""

import numpy as np


def double_dqn_reference(online_q_next, target_q_next, q, action, reward, discount):
    """The targets y = R + discount * Q_target(s', argmax_a Q_online(s', a)) and |y - Q(s, a)|."""
    best = online_q_next.argmax(axis=1)
    y = reward + discount * target_q_next[np.arange(len(best)), best]
    td = y - q[np.arange(len(action)), action]
    return y, np.abs(td)
