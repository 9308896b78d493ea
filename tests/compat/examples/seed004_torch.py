import sys
from ts_core.compat import save, save_grad
import numpy as np
import torch
from pathlib import Path

class NetWithSaveGrad(torch.nn.Module):
    def __init__(self, path):
        super(NetWithSaveGrad, self).__init__()
        self.dense = torch.nn.Linear(3, 2)
        self.apply(self._init_weights)
        self.path = path
    def _init_weights(self, module):
        if isinstance(module, torch.nn.Linear):
            module.weight.data.zero_()
            module.bias.data.zero_()
    def forward(self, x):
        save(self.path + "input", x)
        x = self.dense(x)
        save(self.path + "dense", x)
        x = save_grad(self.path + "dense", x)
        return x

if __name__ == "__main__":
    path = sys.argv[1] + '/torch_ts_save/'
    data = np.array([[0.2, 0.5, 0.2]], dtype=np.float32)
    label = np.array([[1, 0]], dtype=np.float32)
    net = NetWithSaveGrad(path)
    loss_fun = torch.nn.CrossEntropyLoss()
    out = net(torch.tensor(data))
    loss = loss_fun(out, torch.tensor(label))
    loss.backward()
    print(sorted(p.name for p in Path(path).glob("*.npy")))
