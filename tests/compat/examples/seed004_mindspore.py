import sys
from ts_core.compat import save, save_grad
import numpy as np
import mindspore as ms
from mindspore.common.initializer import initializer, Zero
from pathlib import Path

class NetWithSaveGrad(ms.nn.Cell):
    def __init__(self, path):
        super(NetWithSaveGrad, self).__init__()
        self.dense = ms.nn.Dense(3, 2)
        self.apply(self._init_weights)
        self.path = path

    def _init_weights(self, cell):
        if isinstance(cell, ms.nn.Dense):
            cell.weight.set_data(initializer(Zero(), cell.weight.shape, cell.weight.dtype))
            cell.bias.set_data(initializer(Zero(), cell.bias.shape, cell.bias.dtype))

    def construct(self, x):
        save(self.path + "input", x)
        x = self.dense(x)
        save(self.path + "dense", x)
        x = save_grad(self.path + "dense", x)
        return x

if __name__ == "__main__":
    ms.set_context(mode=ms.PYNATIVE_MODE)
    path = sys.argv[1] + '/ms_ts_save/'
    data = np.array([[0.2, 0.5, 0.2]], dtype=np.float32)
    label = np.array([[1, 0]], dtype=np.float32)
    net = NetWithSaveGrad(path)
    loss_fn = ms.nn.CrossEntropyLoss()
    def forward_fn(data, label):
        logits = net(data)
        loss = loss_fn(logits, label)
        return loss, logits
    grad_fn = ms.grad(forward_fn, grad_position=None, weights=net.trainable_params(), has_aux=True, return_ids=True)
    grads, _ = grad_fn(ms.Tensor(data), ms.Tensor(label))
    print(sorted(p.name for p in Path(path).glob("*.npy")))
