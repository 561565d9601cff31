//! Objects → Address and Authorization (`control-plane.md` §1–§4).
