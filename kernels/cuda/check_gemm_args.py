#!/usr/bin/python3
"""Checks, without a GPU, that the cuBLAS calls in kern_cuda.cu compute what
the CPU reference computes: an emulator of cublasGemmStridedBatchedEx's
column-major semantics runs the exact argument lists of the attention and
dense-layer products on small random tensors and compares them with the
row-major formulas (NumPy). Run: /usr/bin/python3 kernels/cuda/check_gemm_args.py
It does not replace `make test-gpu`; it catches transposed or swapped
arguments, the usual mistake when mapping row-major math onto cuBLAS."""
import numpy as np
rng=np.random.default_rng(0)
def cm(buf, off, rows, cols, ld):
    # column-major view rows x cols
    return np.array([[buf[off + r + c*ld] for c in range(cols)] for r in range(rows)])
def gemm_b(ta,tb,m,n,k,alpha,A,lda,sa,Bm,ldb,sb,beta,Cm,ldc,sc,batch):
    for i in range(batch):
        a = cm(A,i*sa,m if ta=='N' else k, k if ta=='N' else m, lda)
        if ta=='T': a=a.T
        b = cm(Bm,i*sb,k if tb=='N' else n, n if tb=='N' else k, ldb)
        if tb=='T': b=b.T
        c = cm(Cm,i*sc,m,n,ldc)
        r = alpha*a@b + beta*c
        for rr in range(m):
            for cc in range(n):
                Cm[i*sc + rr + cc*ldc] = r[rr,cc]
B,T,NH,hs=2,5,2,3; C=NH*hs; BH=B*NH
qkv=rng.standard_normal((B,T,3*C)).astype(np.float64)
dout=rng.standard_normal((B,T,C))
causal=True
# reference
q=qkv[:,:,:C].reshape(B,T,NH,hs).transpose(0,2,1,3)
k=qkv[:,:,C:2*C].reshape(B,T,NH,hs).transpose(0,2,1,3)
v=qkv[:,:,2*C:].reshape(B,T,NH,hs).transpose(0,2,1,3)
sc=1/np.sqrt(hs)
pre=q@k.transpose(0,1,3,2)*sc
mask=np.tril(np.ones((T,T),bool))
pre_m=np.where(mask,pre,-np.inf)
att=np.exp(pre_m-pre_m.max(-1,keepdims=True)); att/=att.sum(-1,keepdims=True)
y=att@v
out=y.transpose(0,2,1,3).reshape(B,T,C)
dy=dout.reshape(B,T,NH,hs).transpose(0,2,1,3)
datt=dy@v.transpose(0,1,3,2)
dv=att.transpose(0,1,3,2)@dy
dpre=att*(datt-(att*datt).sum(-1,keepdims=True))
dq=dpre@k*sc
dk=dpre.transpose(0,1,3,2)@q*sc
# emulate our calls with flat buffers (row-major (BH,T,hs) flattened)
qf=q.reshape(-1).copy(); kf=k.reshape(-1).copy(); vf=v.reshape(-1).copy(); dyf=dy.reshape(-1).copy()
sT=T*hs; sTT=T*T
pre_f=np.zeros(BH*T*T)
gemm_b('T','N',T,T,hs,sc,kf,hs,sT,qf,hs,sT,0.0,pre_f,T,sTT,BH)
assert (np.allclose(pre_f.reshape(B,NH,T,T), pre))
att_f=att.reshape(-1).copy()
y_f=np.zeros(BH*T*hs)
gemm_b('N','N',hs,T,T,1.0,vf,hs,sT,att_f,T,sTT,0.0,y_f,hs,sT,BH)
assert (np.allclose(y_f.reshape(B,NH,T,hs), y))
datt_f=np.zeros(BH*T*T)
gemm_b('T','N',T,T,hs,1.0,vf,hs,sT,dyf,hs,sT,0.0,datt_f,T,sTT,BH)
assert (np.allclose(datt_f.reshape(B,NH,T,T), datt))
dv_f=np.zeros(BH*T*hs)
gemm_b('N','T',hs,T,T,1.0,dyf,hs,sT,att_f,T,sTT,0.0,dv_f,hs,sT,BH)
assert (np.allclose(dv_f.reshape(B,NH,T,hs), dv))
dpre_f=dpre.reshape(-1).copy()
dq_f=np.zeros(BH*T*hs)
gemm_b('N','N',hs,T,T,sc,kf,hs,sT,dpre_f,T,sTT,0.0,dq_f,hs,sT,BH)
assert (np.allclose(dq_f.reshape(B,NH,T,hs), dq))
dk_f=np.zeros(BH*T*hs)
gemm_b('N','T',hs,T,T,sc,qf,hs,sT,dpre_f,T,sTT,0.0,dk_f,hs,sT,BH)
assert (np.allclose(dk_f.reshape(B,NH,T,hs), dk))
# matmul fwd/bwd of the dense layer (kern_cuda gemm helper, non-batched)
N,Cc,OC=4,3,5
inp=rng.standard_normal((N,Cc)); w=rng.standard_normal((OC,Cc)); do=rng.standard_normal((N,OC))
o=np.zeros(N*OC); gemm_b('T','N',OC,N,Cc,1.0,w.reshape(-1),Cc,0,inp.reshape(-1),Cc,0,0.0,o,OC,0,1)
assert (np.allclose(o.reshape(N,OC), inp@w.T))
di=np.zeros(N*Cc); gemm_b('N','N',Cc,N,OC,1.0,w.reshape(-1),Cc,0,do.reshape(-1),OC,0,1.0,di,Cc,0,1)
assert (np.allclose(di.reshape(N,Cc), do@w))
dw=np.zeros(OC*Cc); gemm_b('N','T',Cc,OC,N,1.0,inp.reshape(-1),Cc,0,do.reshape(-1),OC,0,1.0,dw,Cc,0,1)
assert (np.allclose(dw.reshape(OC,Cc), do.T@inp))
print("cuBLAS argument lists match the row-major formulas (attention q.k, att.v, datt, dv, dq, dk; dense fwd, dinp, dw)")
