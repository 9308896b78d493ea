"""The same small network in torch and MindSpore, with shared weights."""
import numpy as np

X = np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3)


def weights(seed=0):
    rng = np.random.default_rng(seed)
    return {"fc.weight": rng.standard_normal((4, 3)).astype(np.float32),
            "fc.bias": rng.standard_normal(4).astype(np.float32),
            "fc2.weight": rng.standard_normal((2, 4)).astype(np.float32),
            "fc2.bias": rng.standard_normal(2).astype(np.float32)}


def torch_net(w):
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 4)
            self.relu = torch.nn.ReLU()
            self.drop = torch.nn.Dropout(0.5)
            self.fc2 = torch.nn.Linear(4, 2)

        def forward(self, x):
            return torch.nn.functional.relu(self.fc2(self.drop(self.relu(self.fc(x))))) * 2

    net = Net()
    with torch.no_grad():
        for n, p in net.named_parameters():
            p.copy_(torch.from_numpy(w[n]))
    return net


def ms_net(w, extra_reshape=False):
    """The torch net ported; `extra_reshape` adds a call torch does not make (a no-op reshape
    after fc), as a port may."""
    import mindspore as ms

    class Net(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = ms.nn.Dense(3, 4)
            self.relu = ms.nn.ReLU()
            self.drop = ms.nn.Dropout(p=0.5)
            self.fc2 = ms.nn.Dense(4, 2)

        def construct(self, x):
            h = self.fc(x)
            if extra_reshape:
                h = ms.ops.reshape(h, h.shape)
            return ms.ops.relu(self.fc2(self.drop(self.relu(h)))) * 2

    net = Net()
    for n, p in net.parameters_and_names():
        p.set_data(ms.Tensor(w[n]))
    return net


def numpy_forward(w, x=X):
    h = np.maximum(x @ w["fc.weight"].T + w["fc.bias"], 0)
    o = h @ w["fc2.weight"].T + w["fc2.bias"]
    return h, o, np.maximum(o, 0) * 2


def run_torch(out, w, steps=1, **start):
    import torch
    from ts_core.compat import migrator
    net = torch_net(w)
    migrator.api_dump_init(net, str(out), retain_backward=True)
    for _ in range(steps):
        migrator.api_dump_start(**start)
        x = torch.from_numpy(X.copy()).requires_grad_()
        net(x).sum().backward()
        migrator.api_dump_stop()
    return net


def run_ms(out, w, steps=1, extra_reshape=False, **start):
    import mindspore as ms
    from ts_core.compat import migrator
    from ts_core.backends.mindspore._runtime import warm_up
    warm_up()
    net = ms_net(w, extra_reshape)
    migrator.api_dump_init(net, str(out), retain_backward=True)
    for _ in range(steps):
        migrator.api_dump_start(**start)
        ms.grad(lambda x: net(x).sum())(ms.Tensor(X.copy()))
        migrator.api_dump_stop()
    return net
