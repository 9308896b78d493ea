/* The calling thread's Python stack as (code object address, position) pairs, innermost first;
 * the position is the last instruction's offset (PyFrame_GetLasti, 3.11+: constant time), else
 * the line (PyFrame_GetLineNumber scans the code's line table: ~100 ns a frame).
 *
 * stack.json needs the stack of every recorded call; walking it in Python costs ~0.25 us a
 * frame (~9 us a call in a transformers model). Here it is one C loop through CPython's
 * public frame API (3.9+). No Python.h: the five API functions are handed over as addresses
 * by tsp_frames_init (ctypes.pythonapi), so this file builds with the other kernels and
 * never leaves an undefined symbol in the library. Must be called with the GIL held
 * (ctypes.PyDLL). */
#include <stdint.h>
#include <stddef.h>

typedef void *(*get_frame_fn)(void);          /* PyEval_GetFrame: borrowed */
typedef void *(*frame_back_fn)(void *);       /* PyFrame_GetBack: new reference or NULL */
typedef void *(*frame_code_fn)(void *);       /* PyFrame_GetCode: new reference */
typedef int (*frame_line_fn)(void *);         /* PyFrame_GetLasti or PyFrame_GetLineNumber */
typedef void (*decref_fn)(void *);            /* Py_DecRef */

static get_frame_fn get_frame;
static frame_back_fn frame_back;
static frame_code_fn frame_code;
static frame_line_fn frame_line;
static decref_fn decref;

int tsp_frames_init(void *gf, void *fb, void *fc, void *fl, void *dr) {
    if (!gf || !fb || !fc || !fl || !dr) return -1;
    get_frame = (get_frame_fn)gf;
    frame_back = (frame_back_fn)fb;
    frame_code = (frame_code_fn)fc;
    frame_line = (frame_line_fn)fl;
    decref = (decref_fn)dr;
    return 0;
}

/* Fills out[2*i], out[2*i+1] with the i-th frame's code address and position; returns the number
 * of frames, or -1 when the stack is deeper than max_frames (the caller walks it in Python). */
int64_t tsp_frames(int64_t *out, int64_t max_frames) {
    if (!get_frame) return -1;
    void *frame = get_frame();
    int owned = 0;
    int64_t n = 0;
    while (frame) {
        if (n == max_frames) {
            if (owned) decref(frame);
            return -1;
        }
        void *code = frame_code(frame);
        out[2 * n] = (int64_t)(intptr_t)code;
        out[2 * n + 1] = frame_line(frame);
        decref(code);              /* the caller keeps every code object it met alive */
        n++;
        void *back = frame_back(frame);
        if (owned) decref(frame);
        frame = back;
        owned = 1;
    }
    return n;
}
